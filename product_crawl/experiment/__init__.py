"""The experiment of the paper's section 3: dynamic scheduling against its baselines, on the simulated web.

``scrapy experiment`` (docs/experiment.md) runs each configuration in turn on a fresh local cluster
(:mod:`.runner`), turns the samples into metrics (:mod:`.summary`) and writes ``summary.json``, the plots and
``report.html`` (:mod:`.report`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from product_crawl.experiment.runner import (
    CONFIGURATIONS,
    DEFAULT_CONFIGURATIONS,
    ExperimentError,
    Options,
    Progress,
    corpus_totals,
    make_options,
    run_configuration,
)

__all__ = ["CONFIGURATIONS", "DEFAULT_CONFIGURATIONS", "ExperimentError", "Options", "make_options",
           "run_experiment"]


def run_experiment(opts: Options, *, redis_url: str = "", mongo_uri: str = "", progress: Progress | None = None
                   ) -> tuple[dict[str, Any], Path]:
    """Run every configuration of ``opts``; write summary.json, the plots and report.html into ``opts.out``.

    Real processes (``redis_url``, ``mongo_uri``), or the cluster simulator if ``opts.sim`` (no services; each
    configuration ``opts.repeat`` times, ``opts.jobs`` runs at once). Returns the summary and the report's path.
    The raw samples of each run (the first seed's, simulated) are kept in ``raw/<name>.json``.
    """
    from product_crawl.experiment.machine import (
        Costs,
        MachineError,
        bound_latency,
        fastest,
        machine_processes,
        measure,
    )
    from product_crawl.experiment.report import write_html, write_plots
    from product_crawl.experiment.sim import simulate_all
    from product_crawl.experiment.summary import summarize

    try:
        (opts.out / "raw").mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file there, a folder that cannot be written, ...
        raise ExperimentError(f"--out {opts.out}: expected a folder the experiment can write its results in; "
                              f"making {exc.filename} failed: {exc.strerror}") from exc
    totals = corpus_totals(opts.profile, opts.sites, opts.seed, opts.products)
    raws: dict[str, dict[str, Any]] = {}
    repeats: dict[str, list[int]] = {}
    measured: list[tuple[str, Costs, list[dict[str, float]]]] = []

    def measure_machine(when: str) -> None:
        """The machine's costs now (docs/experiment.md, "vs best"): before the configurations and after them."""
        nonlocal progress
        progress = progress or Progress()
        processes = machine_processes(len(opts.nodes))
        progress.update(f"[machine {when}] plain Scrapy in {processes} processes, 2 windows of "
                        f"{opts.machine_seconds:g} s, pages served in {latency:g} s")
        try:
            costs, windows = measure(opts.machine_seconds, processes, opts.out, latency)
        except MachineError as exc:
            raise ExperimentError(f"measuring the machine (--machine-seconds {opts.machine_seconds:g}): {exc}") from exc
        measured.append((when, costs, windows))
        progress.done(f"[machine {when}] a page {1000 * costs.page_cpu:.2f} ms, an item {1000 * costs.item_cpu:.3f} "
                      f"ms of CPU (a crawler {1000 * costs.node_page_cpu:.2f} / {1000 * costs.node_item_cpu:.3f} ms)")

    measuring = not opts.sim and opts.machine_seconds > 0
    # The machine serves its pages as fast as the run's quickest pair (docs/experiment.md, "vs best").
    latency = bound_latency(opts.profile, [n.address for n in opts.nodes], opts.sites)
    if measuring:
        measure_machine("before")
    simulated = simulate_all(opts, totals, jobs=opts.jobs, progress=progress) if opts.sim else {}
    for i, name in enumerate(opts.configurations, 1):
        if opts.sim:
            raw = simulated[name][0]
            repeats[name] = [r["samples"][-1]["items"] for r in simulated[name]]
        else:
            raw = run_configuration(name, opts, redis_url=redis_url, mongo_uri=mongo_uri, progress=progress,
                                    label=f"{name} {i}/{len(opts.configurations)}")
        raws[name] = raw
        (opts.out / "raw" / f"{name}.json").write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    machine: dict[str, Any] | None = None
    if measuring:
        measure_machine("after")
        machine = {"costs": fastest([windows for _, _, windows in measured]), "latency": latency,
                   "windows": [{"when": when, **w} for when, _, windows in measured for w in windows],
                   "measured": [{"when": when, **dataclasses.asdict(costs)} for when, costs, _ in measured]}
    summary = summarize(raws, opts, totals, repeats, machine)
    (opts.out / "summary.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1), encoding="utf-8")
    images = write_plots(summary, opts.out)
    return summary, write_html(summary, opts.out, images)
