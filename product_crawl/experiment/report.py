"""The experiment's outputs besides summary.json: PNG plots (matplotlib, Agg), report.html and the console table.

Plots (docs/experiment.md shows them):

``fig4.png`` (and ``fig4_<configuration>.png`` for every other run)
    The paper's Figure 4: one panel per node, one colour per site. Lines: the scheduler's moving completion
    estimate of (site, node); dots: the completion measured over the last ``WINDOW`` seconds (collected / offered
    results). Dotted vertical lines mark the profile's phase changes.
``fig5.png``
    The paper's Figure 5: per node, the relative gain in items attributed to each strategy (with ablation runs)
    and of the full dynamic configuration over ``shared``.
``items.png``
    Unique items in MongoDB over time, one line per configuration.
``ratios.png`` (simulated, ``--repeat`` > 1)
    Per configuration, the distribution over seeds of unique items / best possible.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from product_crawl.experiment.runner import WINDOW

MAX_PANELS = 24  # nodes drawn in Figures 4 and 5 (the first ones): 1,000 panels or bars are unreadable
MAX_LISTED = 12  # nodes (products) named one by one in the console and the report's header; more: a summary


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the machines this runs on
    import matplotlib.pyplot as plt

    return plt


def plot_completion(summary: dict[str, Any], configuration: str, path: Path) -> None:
    """Figure 4 for one configuration: a grid of panels, one per node, one colour per site."""
    plt = _pyplot()
    run = summary["runs"][configuration]
    nodes = list(summary["nodes"])[:MAX_PANELS]
    cols = 2 if len(nodes) > 1 else 1
    rows = (len(nodes) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False, sharex=True, sharey=True)
    colours = plt.get_cmap("tab10")
    for i, node in enumerate(nodes):
        ax = axes[i // cols][i % cols]
        for j, site in enumerate(summary["sites"]):
            colour = colours(j % 10)
            est = run["estimate_over_time"].get(node, {}).get(site, [])
            measured = run["completion_over_time"].get(node, {}).get(site, [])
            if est:
                ax.plot([p[0] for p in est], [p[1] for p in est], color=colour, label=site, linewidth=1.6)
            if measured:
                ax.scatter([p[0] for p in measured], [p[1] for p in measured], color=colour, s=10, alpha=0.6,
                           label=None if est else site)
        for t in summary["profile"]["phases"]:
            if t <= summary["duration"]:
                ax.axvline(t, color="grey", linestyle=":", linewidth=1)
        info = summary["nodes"][node]
        suited = ", ".join(run["nodes"][node]["suited_sites"]) or "-"
        ax.set_title(f"{node} ({info['address']}) - suits at the end: {suited}", fontsize=9)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlim(0, summary["duration"])
        ax.grid(alpha=0.3)
        if i // cols == rows - 1:
            ax.set_xlabel("seconds since start")
        if i % cols == 0:
            ax.set_ylabel("completion rate")
    for k in range(len(nodes), rows * cols):
        axes[k // cols][k % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for row in axes:
        for ax in row:
            for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
    if labels:  # a configuration without estimates (scrapy_redis) has no lines to name
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    shown = "" if len(summary["nodes"]) <= MAX_PANELS else f"the first {MAX_PANELS} of {len(summary['nodes'])} nodes, "
    fig.suptitle(f"Completion per site on {shown}each node ({configuration}): line = moving estimate, "
                 f"dots = measured over {WINDOW:.0f} s", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_gains(summary: dict[str, Any], path: Path) -> None:
    """Figure 5: per node, grouped bars of the relative gain per strategy (and of dynamic over shared)."""
    plt = _pyplot()
    nodes = list(summary["nodes"])[:MAX_PANELS]
    series: list[tuple[str, dict[str, float | None]]] = [
        (f"{s} (vs dynamic without it)", v) for s, v in summary["gains"].get("strategies", {}).items()]
    if "over_shared" in summary["gains"]:
        series.append(("dynamic vs shared", summary["gains"]["over_shared"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(nodes) + 2), 4))
    if not series:
        ax.text(0.5, 0.5, "no gains: run dynamic with shared and/or --ablations", ha="center", va="center")
        ax.axis("off")
    width = 0.8 / max(1, len(series))
    for k, (label, values) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(nodes))]
        ax.bar(xs, [100 * (values.get(n) or 0.0) for n in nodes], width=width, label=label)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(nodes)), nodes)
    ax.set_ylabel("gain in items collected (%)")
    shown = "" if len(summary["nodes"]) <= MAX_PANELS else f" (the first {MAX_PANELS} of {len(summary['nodes'])} nodes)"
    ax.set_title(f"Efficiency gain per node attributed to each strategy{shown}")
    if series:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_items(summary: dict[str, Any], path: Path) -> None:
    """Unique items over time, one line per configuration."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, run in summary["runs"].items():
        pts = run["items_over_time"]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{name} ({run['unique_items']})")
    for t in summary["profile"]["phases"]:
        if t <= summary["duration"]:
            ax.axvline(t, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("unique items in MongoDB")
    ax.set_title(f"Items collected over time (profile {summary['profile']['name']}, seed {summary['seed']})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(summary: dict[str, Any], out: Path) -> list[str]:
    """Write every plot into ``out``; returns their file names."""
    names = []
    main = "dynamic" if "dynamic" in summary["runs"] else next(iter(summary["runs"]))
    for name in summary["runs"]:
        file = "fig4.png" if name == main else f"fig4_{name}.png"
        plot_completion(summary, name, out / file)
        names.append(file)
    plot_gains(summary, out / "fig5.png")
    plot_items(summary, out / "items.png")
    extra = ["ratios.png"] if plot_distribution(summary, out / "ratios.png") else []
    return [names[0], "fig5.png", "items.png", *extra, *names[1:]]


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def table_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-configuration table (console and HTML)."""
    items = {n: r["unique_items"] for n, r in summary["runs"].items()}
    headers = ["configuration", "unique items", "completion", "served share", "items/s", "vs shared", "vs oracle",
               "vs best", "moved out", "modified", "recalled", "dead", "tasks done"]
    rows = []
    for name, run in summary["runs"].items():
        nodes = run["nodes"].values()
        rows.append([name, str(run["unique_items"]), _num(run["completion"], "{:.4f}"), _num(run["served_share"]),
                     _num(run["items_per_second"], "{:.1f}"),
                     _num(items[name] / items["shared"] if items.get("shared") else None),
                     _num(items[name] / items["oracle"] if items.get("oracle") else None),
                     _num(run.get("vs_best")),
                     *(str(sum(n[k] for n in nodes)) for k in ("moved_out", "modified", "recalled", "dead")),
                     f"{run['tasks']['done']}/{run['tasks']['total']}"
                     + (f" at {run['exhausted_at']:g} s" if run.get("exhausted_at") is not None else "")])
    return headers, rows


def goal_lines(summary: dict[str, Any]) -> list[str]:
    """One sentence per goal: reached or not, with the numbers."""
    r, lines = summary["ratios"], []
    for goal, met in summary["goals"].items():
        state = "not measured" if met is None else ("REACHED" if met else "NOT reached")
        if goal.startswith("dynamic_vs_shared"):
            detail = f"dynamic / shared = {_num(r['dynamic_vs_shared'])}"
        elif goal.startswith("dynamic_vs_scrapy_redis"):
            detail = f"dynamic / scrapy_redis = {_num(r.get('dynamic_vs_scrapy_redis'))}"
        elif goal.startswith("dynamic_vs_oracle"):
            detail = f"dynamic / oracle = {_num(r['dynamic_vs_oracle'])}"
        elif goal.startswith("dynamic_vs_best"):
            detail = (f"dynamic / best possible = {_num(r.get('dynamic_vs_best'))}, best possible "
                      f"{summary['best_possible']['items']} unique items")
        else:
            dyn = summary["runs"].get("dynamic", {}).get("nodes", {})
            detail = "late pages on suited sites: " + _listed({n: v["suited_share"] for n, v in dyn.items()})
        ratio = goal.split(">=")[0].removeprefix("dynamic_")  # vs_shared, vs_oracle, ...
        q = ((summary.get("distribution") or {}).get("dynamic") or {}).get(ratio)
        if q:  # the goal is judged on the first seed, whose run the tables show; the others beside it
            detail += f"; over {q['n']} seeds median {_num(q['median'])}, min {_num(q['min'])}"
        lines.append(f"{goal}: {state} ({detail})")
    return lines


def good_pair_rows(summary: dict[str, Any], limit: int = 40) -> tuple[list[str], list[list[Any]]]:
    """One row per pair the best schedule needs (node, site, since, then each configuration's delay; "never" if
    it did not use it), the first ``limit``, then rows of quantiles per configuration and the count of pairs that
    turned good after the configuration's last run on their site (left out of the quantiles)."""
    gp = summary.get("good_pairs") or {}
    names = list(gp.get("delays", {}))
    if not gp.get("pairs") or not names:
        return [], []
    rows: list[list[Any]] = [[n, s, f"{t:g}", "yes" if c else "no",
                              *("never" if gp["delays"][x][i] is None else f"{gp['delays'][x][i]:g}" for x in names)]
                             for i, (n, s, t, c) in enumerate(gp["pairs"][:limit])]
    for group in ("all", "clear"):
        for q in ("median", "p90", "max"):
            rows.append([f"{q} ({group})", "", "", "", *(_num((gp["stats"][x][group] or {}).get(q), "{:.1f}")
                                                         for x in names)])
    rows.append(["good after their site's work", "", "", "",
                 *(str(gp["stats"][x].get("after_their_sites_work", 0)) for x in names)])
    return ["node", "site", "good from (s)", "clearly better", *names], rows


def _listed(per_node: dict[str, float | None], fmt: str = "{:.2f}") -> str:
    """``node value, ...`` for up to MAX_LISTED nodes; past that, the rest as a count and their quantiles."""
    items = list(per_node.items())
    text = ", ".join(f"{n} {_num(v, fmt)}" for n, v in items[:MAX_LISTED]) or "-"
    if len(items) > MAX_LISTED:
        from product_crawl.experiment.summary import quantiles

        q = quantiles([v for _, v in items if v is not None])
        text += f", ... ({len(items) - MAX_LISTED} more; over all {len(items)} nodes: " + (
            "no values)" if q is None else f"min {_num(q['min'], fmt)}, median {_num(q['median'], fmt)}, "
                                           f"max {_num(q['max'], fmt)})")
    return text


def distribution_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the ratio distribution over simulated seeds (empty without ``--repeat``)."""
    headers = ["configuration", "ratio", "min", "p10", "median", "p90", "max", "seeds"]
    rows = []
    for name, entry in (summary.get("distribution") or {}).items():
        for ratio in ("vs_best", "vs_shared", "vs_oracle", "vs_paper"):
            q = entry.get(ratio)
            if q:
                rows.append([name, ratio, *(_num(q[k]) for k in ("min", "p10", "median", "p90", "max")), str(q["n"])])
    return headers, rows


def plot_distribution(summary: dict[str, Any], path: Path) -> bool:
    """Box plot of each configuration's unique items / best possible over the simulated seeds; False if none."""
    dist = summary.get("distribution") or {}
    data = [(name, e["vs_best"]) for name, e in dist.items() if e.get("vs_best")]
    if not data:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(data) + 2), 4))
    stats = [{"label": n, "whislo": q["min"], "q1": q["p10"], "med": q["median"], "q3": q["p90"], "whishi": q["max"],
              "fliers": []} for n, q in data]
    ax.bxp(stats, showfliers=False)
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set_ylabel("unique items / best possible")
    ax.set_title(f"Ratio to the best possible over {data[0][1]['n']} simulated seeds (box: p10-p90)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def console_table(summary: dict[str, Any]) -> list[str]:
    """The lines ``scrapy experiment`` prints at the end."""
    from product_crawl.commands.status import table

    headers, rows = table_rows(summary)
    lines = table(headers, rows)
    nodes = list(summary["nodes"])
    if len(nodes) <= MAX_LISTED:
        node_rows = [[name, *(f"{run['nodes'][n]['items']}" for n in nodes)] for name, run in summary["runs"].items()]
        lines += ["", "items per node (first stored by):", *table(["configuration", *nodes], node_rows)]
    else:
        from product_crawl.experiment.summary import quantiles

        node_rows = [[name, *(str(q[k]) for k in ("min", "p10", "median", "p90", "max"))]
                     for name, run in summary["runs"].items()
                     if (q := quantiles([v["items"] for v in run["nodes"].values()]))]
        lines += ["", f"items per node over the {len(nodes)} nodes (first stored by):",
                  *table(["configuration", "min", "p10", "median", "p90", "max"], node_rows)]
    over = summary["gains"].get("over_shared")
    if over:
        lines += ["", "gain over shared per node: " + _listed(over, "{:+.0%}")]
    for s, v in summary["gains"].get("strategies", {}).items():
        lines.append(f"gain from {s} per node: " + _listed(v, "{:+.0%}"))
    head, rows = distribution_rows(summary)
    if rows:
        lines += ["", "ratio distribution over simulated seeds:", *table(head, rows)]
    return [*lines, "", *goal_lines(summary)]


def _names(what: str, names: list[str]) -> str:
    """``sites a, b`` or, past MAX_LISTED names, ``200 sites (a, b, ...)``, HTML-escaped."""
    if len(names) <= MAX_LISTED:
        return html.escape(f"{what}s {', '.join(names)}")
    return html.escape(f"{len(names)} {what}s ({', '.join(names[:MAX_LISTED])}, ...)")


def write_html(summary: dict[str, Any], out: Path, images: list[str]) -> Path:
    """``report.html``: goals with numbers, the table, the plots, the per-node details and the settings."""
    e = html.escape
    headers, rows = table_rows(summary)

    def tab(head: list[str], body: list[list[str]]) -> str:
        return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" +
                "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in body) + "</table>")

    node_head = ["configuration", "node", "items", "runs", "pages", "served share", "moved out", "moved in",
                 "modified", "recalled", "dead", "late pages on suited sites", "suited sites (end)"]
    node_body = [[name, n, str(v["items"]), str(v["runs"]), str(v["pages"]),
                  _num(v["collected"] / v["offered"] if v["offered"] else None), str(v["moved_out"]),
                  str(v["moved_in"]), str(v["modified"]), str(v["recalled"]), str(v["dead"]),
                  _num(v["suited_share"]), ", ".join(v["suited_sites"])]
                 for name, run in summary["runs"].items() for n, v in run["nodes"].items()]
    goals = "".join(f"<li>{e(line)}</li>" for line in goal_lines(summary))
    figs = "".join(f'<figure><img src="{e(img)}" alt="{e(img)}"><figcaption>{e(img)}</figcaption></figure>'
                   for img in images)
    settings = ", ".join(f"{k}={v}" for k, v in summary["settings"].items())
    best = summary["best_possible"]
    m = best["model"]
    bound_text = (f"Best possible: {best['items']} unique items (the profile's true rates, phase by phase, the best "
                  f"assignment of nodes to sites within the sites' task limits, each node's {m['concurrency']} page "
                  f"slots and own CPU ({1000 * m['node_page_cpu']:.2f} ms a page, {1000 * m['node_item_cpu']:.3f} ms "
                  + (f"an item), and this machine's {m['cores']:g} cores shared by the nodes, the web and MongoDB "
                     f"({1000 * m['machine_page_cpu']:.2f} ms a page, {1000 * m['machine_item_cpu']:.3f} ms an "
                     f"item: the cheapest crawler, measured in {m['source']}). " if "cores" in m
                     else f"an item: {m['source']}). ")
                  + ("Simulated runs (scheduler_ext.sim)." if summary.get("simulated") else "Real processes."))
    dhead, drows = distribution_rows(summary)
    dist = f"<h2>Ratio distribution over simulated seeds</h2>{tab(dhead, drows)}" if drows else (
        "<h2>Ratio distribution over simulated seeds</h2><p>One seed: <code>--repeat N</code> (N &gt; 1) runs each "
        "configuration on N seeds and shows the distribution of its ratios here.</p>" if summary.get("simulated")
        else "")
    ghead, grows = good_pair_rows(summary)
    dist += (f"<h2>Pairs the best schedule needs: seconds from turning good to first use</h2>{tab(ghead, grows)}"
             if grows else "")
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Experiment: {e(summary['profile']['name'])}</title>
<style>body{{font-family:sans-serif;max-width:1300px;margin:1em auto}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #bbb;padding:2px 6px;font-size:13px}}img{{max-width:100%}}figure{{margin:1em 0}}</style>
</head><body>
<h1>Dynamic scheduling experiment</h1>
<p>Profile <b>{e(summary['profile']['name'])}</b> ({e(summary['profile']['source'])}), seed {summary['seed']},
{summary['duration']:.0f} s per configuration, {len(summary['nodes'])} nodes, {_names('site', summary['sites'])},
{_names('product', summary['products'])}; the simulated web holds {summary['corpus']['total']} results for these
queries.</p>
<h2>Goals</h2><ul>{goals}</ul>
<h2>Configurations</h2>{tab(headers, rows)}
<p>{e(bound_text)}</p>
{dist}
{figs}
<h2>Per node</h2>{tab(node_head, node_body)}
<p>Settings of every configuration: {e(settings)}</p>
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
