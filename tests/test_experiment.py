"""Tests of ``scrapy experiment`` (product_crawl/experiment, product_crawl/oracle.py).

The short form of the experiment runs a whole cluster twice (dynamic, then shared) on the ``duel`` profile: two
nodes, two sites, each node excellent on one site and terrible on the other. Bad input is refused before anything
starts. The oracle's rate is checked against the profile it reads from a real simulated web.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import PROJECT, run_scrapy

from product_crawl.experiment import ExperimentError, make_options
from product_crawl.experiment.machine import fastest
from product_crawl.experiment.runner import experiment_nodes, parse_configurations, profile_sites, suited_sites
from product_crawl.experiment.summary import windowed
from product_crawl.oracle import OracleAllocation, expected_rate, fetch_truth
from product_crawl.simweb.profile import load_profile
from product_crawl.simweb.server import SimWebProcess
from scheduler_ext.exceptions import ConfigurationError
from scheduler_ext.models import Subtask
from scheduler_ext.strategies import NodeView

DUEL = Path(__file__).resolve().parent.parent / "product_crawl" / "simweb" / "profiles" / "duel.json"

RUN_KEYS = {"description", "settings", "unique_items", "completion", "served_share", "items_per_second", "tasks",
            "exhausted", "exhausted_at", "nodes", "items_over_time", "completion_over_time", "estimate_over_time",
            "final_completion"}
NODE_KEYS = {"address", "label", "items", "moved_out", "moved_in", "modified", "recalled", "dead", "runs", "pages",
             "offered", "collected", "requests", "errors", "blocked", "suited_sites", "late_pages", "suited_share"}


# --- bad input: refused before anything starts ---------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--strategies", "dynamic,fifo"], "unknown configuration 'fifo'; expected names from: dynamic, shared"),
    (["--duration", "5"], "--duration: expected a number of seconds, at least 20"),
    (["--sim", "--duration", "1e400"], "--duration: expected a number of seconds, at least 20 (shorter runs end "
                                       "before the nodes have measured anything) and at most 604800 (a week), got "
                                       "inf"),
    (["--duration", "1e9"], "at most 604800 (a week), got 1e+09"),
    # --set: each configuration's settings as its nodes and control read them, not once the run has started
    (["--set", "SCHEDEXT_PAGE_LIMIT=abc"], "--set SCHEDEXT_PAGE_LIMIT: expected an integer >= 1, got 'abc'"),
    (["--sim", "--set", "SCHEDEXT_ALLOCATION=nosuch.Thing"], "--set SCHEDEXT_ALLOCATION: cannot load strategy"),
    (["--sim", "--set", "DOWNLOAD_DELAY=x"], "--set DOWNLOAD_DELAY: expected a number >= 0, got 'x'"),
    (["--sim", "--set", "DOWNLOAD_DELAY=604801"],
     "--set DOWNLOAD_DELAY: expected a number >= 0 and <= 604800, got 604801"),  # as the node checks it
    (["--sim", "--set", "CONCURRENT_REQUESTS=0"], "--set CONCURRENT_REQUESTS: expected an integer >= 1, got 0"),
    (["--profile", "{bad}"], "default: missing required field"),
    (["--profile", "/nonexistent/profile.json"], "cannot read it"),
    (["--machine-seconds", "-1"], "--machine-seconds: expected 0 (the recorded figures) .. 120 seconds"),
    (["--machine-seconds", "nan"], "--machine-seconds: expected 0"),
    (["--sim", "--machine-seconds", "5"], "with --sim (its nodes share no machine)"),
    # the deployment's own prefix and database: an experiment wipes both before each configuration
    (["--prefix", "{pc}"], "--prefix '{pc}': that is this project's deployment's (its settings say so)"),
    (["--database", "product_crawl"], "--database 'product_crawl': that is this project's deployment's"),
])
def test_bad_input_is_refused_before_anything_starts(args: list[str], message: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad"}), encoding="utf-8")
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "REDIS_URL": "redis://127.0.0.1:1/0", "MONGO_URI": "mongodb://127.0.0.1:1"}
    args = [str(bad) if a == "{bad}" else a for a in args]
    result = run_scrapy(["experiment", *args, "--out", str(out)], env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    # Nothing ran: no output folder, and the unreachable services were never asked.
    assert not out.exists()
    assert "does not answer" not in result.stderr


def test_make_options_validates_every_input() -> None:
    with pytest.raises(ExperimentError, match="expected at least one configuration"):
        make_options(strategies=" , ")
    with pytest.raises(ExperimentError, match="expected a number of seconds, at least 20"):
        make_options(duration=float("nan"))
    with pytest.raises(ExperimentError, match="RANDOMIZE_DOWNLOAD_DELAY: expected true or false, got 'maybe'"):
        make_options(overrides={"RANDOMIZE_DOWNLOAD_DELAY": "maybe"})
    with pytest.raises(ExperimentError, match="DOWNLOAD_DELAY: expected a number >= 0, got nan"):
        make_options(overrides={"DOWNLOAD_DELAY": float("nan")})
    with pytest.raises(ExperimentError, match="DOWNLOAD_DELAY: expected a number >= 0, got inf"):
        make_options(overrides={"DOWNLOAD_DELAY": float("inf")})
    with pytest.raises(ExperimentError, match="--set SCHEDEXT_TICK_INTERVAL: expected a number > 0"):
        make_options(strategies="shared", overrides={"SCHEDEXT_TICK_INTERVAL": 0})
    with pytest.raises(ExperimentError, match="--nodes: expected at least 1 node"):
        make_options(nodes=0)
    with pytest.raises(ExperimentError, match="scrapy_redis runs scrapy-redis's own spiders .* simulator does not"):
        make_options(strategies="dynamic,scrapy_redis", sim=True)  # it would have run dynamic again, unnamed
    opts = make_options(profile=str(DUEL), duration=30, strategies="shared", ablations=True)
    assert opts.configurations == ["shared", "dynamic", "no_allocation", "no_modification", "no_recall"]
    assert [(n.id, n.address) for n in opts.nodes] == [("node1", "127.0.0.2"), ("node2", "127.0.0.3")]
    assert opts.sites == ["alpha.cn", "beta.cn"]


def test_profile_helpers_on_the_paper_profile() -> None:
    paper = load_profile("paper")
    assert profile_sites(paper) == ["12315.com", "315tousu.org", "t.163.com", "cca.org.cn", "weibo.com"]
    assert [n.address for n in experiment_nodes(paper, 5)] == [
        "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"]
    # Figure 4's pairs: node 1 suits t.163.com only before the 40 s phase; node 3 loses 12315.com then.
    assert "t.163.com" in suited_sites(paper, "127.0.0.2", profile_sites(paper), 10)
    assert suited_sites(paper, "127.0.0.2", profile_sites(paper), 60) == ["12315.com", "315tousu.org"]
    assert suited_sites(paper, "127.0.0.4", profile_sites(paper), 60) == ["315tousu.org", "t.163.com"]
    assert parse_configurations("oracle") == ["oracle"]


def test_windowed_completion_uses_deltas_of_the_cumulative_counts() -> None:
    samples = [{"t": 0, "pairs": {}}, {"t": 3, "pairs": {"n|s": [100, 90, 1, 10, 0.9]}},
               {"t": 6, "pairs": {"n|s": [200, 110, 2, 20, 0.6]}}, {"t": 20, "pairs": {"n|s": [200, 110, 2, 20, 0.6]}}]
    assert windowed(samples, "n|s", window=3) == [[3, 0.9], [6, 0.2]]
    assert windowed(samples, "n|s", window=10) == [[3, 0.9], [6, 0.55]]


# --- the oracle -----------------------------------------------------------------------------------------------

def test_oracle_rates_come_from_the_served_profile() -> None:
    with SimWebProcess(DUEL, seed=3) as web:
        profile, started_at = fetch_truth(web.url + "/_truth")
    oracle = OracleAllocation(profile, started_at)
    st = Subtask(id="1", task="1", site="alpha.cn", first_page=0, page_limit=5, time_limit=30)
    good = oracle.rate(st, NodeView(id="node1", types=[0], address="127.0.0.2"), None, started_at + 5)  # type: ignore[arg-type]
    bad = oracle.rate(st, NodeView(id="node2", types=[0], address="127.0.0.3"), None, started_at + 5)  # type: ignore[arg-type]
    assert good == expected_rate(profile.behaviour("127.0.0.2", "alpha.cn", 5)) == (19.0, 0.05)
    assert bad[0] < good[0] / 100
    # Never None: the oracle never explores.
    nodes = [NodeView(id="node1", types=[0], address="127.0.0.2", free=1),
             NodeView(id="node2", types=[0], address="127.0.0.3", free=1)]
    assert [(s.id, n) for s, n in oracle.allocate([st], nodes, None, started_at + 5)] == [("1", "node1")]  # type: ignore[arg-type]


def test_oracle_ranks_once_per_phase_and_chooses_what_the_pairwise_rates_choose() -> None:
    """The oracle allocates through the rankings (its truth as per-site figures, made once per phase of the
    profile) and chooses exactly the pairs its own rates choose pair by pair (the specification), across a phase
    change, with avoided nodes, aged subtasks and nodes short of slots."""
    from product_crawl.experiment.sim import generated_profile

    profile = generated_profile("drift", nodes=12, sites=5, duration=60, seed=7)
    nodes = [NodeView(id=f"n{i}", types=[0], address=f"127.0.0.{2 + i}", free=1 + i % 3) for i in range(12)]
    rng = random.Random(7)
    sites = sorted({s for n in profile.nodes.values() for s in n.sites})
    for now in (5.0, 30.0, 50.0):  # before and after the profile's changes at 22 s and 43 s
        window = [Subtask(id=str(i), task=str(i), site=rng.choice(sites), group=f"p{i % 4}", first_page=0,
                          page_limit=5, time_limit=30, since=now - rng.choice((0, 20)),
                          avoid=rng.sample([n.id for n in nodes], rng.choice((0, 0, 1, 2))))
                  for i in range(40)]
        ranked, pairwise = OracleAllocation(profile, 0.0), OracleAllocation(profile, 0.0)
        got = [(st.id, nid) for st, nid in ranked.allocate(window, nodes, None, now)]  # type: ignore[arg-type]
        want = [(st.id, nid) for st, nid in pairwise.allocate_pairwise(window, nodes, None, now)]  # type: ignore[arg-type]
        assert len(got) > 5 and sorted(got) == sorted(want)
    oracle = OracleAllocation(profile, 0.0)
    oracle.allocate(window, nodes, None, 30.0)  # type: ignore[arg-type]
    truth = oracle._truth
    assert truth is not None
    figures = truth.site_figures(sites[0])
    oracle.allocate(window, nodes, None, 40.0)  # type: ignore[arg-type]
    assert truth.site_figures(sites[0]) is figures  # the same phase: kept
    oracle.allocate(window, nodes, None, 45.0)  # type: ignore[arg-type]
    assert truth.site_figures(sites[0]) is not figures  # a new phase: made again


def test_oracle_allocates_nothing_until_the_web_answers() -> None:
    # The control starts before the web (the experiment's clock starts with the web): no truth yet means no
    # allocation, never an error that would dead-letter the window; the first answer is kept.
    st = Subtask(id="1", task="1", site="alpha.cn", first_page=0, page_limit=5, time_limit=30)
    nodes = [NodeView(id="node1", types=[0], address="127.0.0.2", free=1),
             NodeView(id="node2", types=[0], address="127.0.0.3", free=1)]
    absent = OracleAllocation(None, truth_url="http://127.0.0.1:1/_truth")
    assert absent.allocate([st], nodes, None, time.time()) == []  # type: ignore[arg-type]
    with SimWebProcess(DUEL, seed=3) as web:
        oracle = OracleAllocation(None, truth_url=web.url + "/_truth")
        assert [(s.id, n) for s, n in oracle.allocate([st], nodes, None, time.time() + 5)] == [("1", "node1")]  # type: ignore[arg-type]
    assert oracle.profile is not None and oracle.profile.name == "duel"


def test_oracle_names_the_url_when_the_truth_is_missing() -> None:
    with pytest.raises(ConfigurationError, match="127.0.0.1:1/_truth"):
        fetch_truth("http://127.0.0.1:1/_truth", timeout=1)


def _window(pages: int, items: int, cpu: float) -> dict[str, float]:
    return {"pages": pages, "items": items, "seconds": 10.0, "node_cpu": 0.8 * cpu, "web_cpu": 0.1 * cpu,
            "mongo_cpu": 0.1 * cpu}


def test_the_machine_at_its_fastest_is_each_profiles_cheapest_window_never_a_machine_that_never_was() -> None:
    # Two measurements of one machine whose noisy splits err in opposite directions (the 2026-12-04 run): a page of
    # 10 results cost 8.9 ms of CPU in the first and 8.5 in the second, a page of 2 results 4.0 and 5.5 ms.
    before = [_window(2000, 20000, 17.8), _window(4000, 8000, 16.0)]
    after = [_window(2000, 20000, 17.0), _window(4000, 8000, 22.0)]
    kept = fastest([before, after])
    # The bound's page of 10 results costs what the cheaper full window measured, its page of 2 what the cheaper
    # sparse window measured: the fastest the machine was seen doing each, no faster.
    assert kept.page_cpu + 10 * kept.item_cpu == pytest.approx(17.0 / 2000, rel=1e-4)
    assert kept.page_cpu + 2 * kept.item_cpu == pytest.approx(16.0 / 4000, rel=1e-4)
    # Each cost at its own lowest would make that page of 10 about a quarter cheaper than either measurement saw.
    each = [fastest([m]) for m in (before, after)]
    lowest = min(c.page_cpu for c in each) + 10 * min(c.item_cpu for c in each)
    assert lowest < 0.8 * min(c.page_cpu + 10 * c.item_cpu for c in each)
    # The crawler's own costs come from the same two windows.
    assert kept.node_page_cpu + 10 * kept.node_item_cpu == pytest.approx(0.8 * 17.0 / 2000, rel=1e-4)


def test_windows_too_far_apart_to_solve_together_fall_back_to_one_measurement() -> None:
    # The cheapest sparse window is so cheap beside the cheapest full one that the two give a page no CPU at all.
    slow = [_window(1000, 10000, 10.0), _window(1000, 2000, 5.0)]
    quick_sparse = [_window(1000, 10000, 12.0), _window(1000, 2000, 1.5)]
    kept = fastest([slow, quick_sparse])
    assert (kept.page_cpu, kept.item_cpu) == (fastest([slow]).page_cpu, fastest([slow]).item_cpu)
    assert kept.page_cpu > 0


# --- the short experiment -----------------------------------------------------------------------------------

def test_no_node_starves_where_every_pair_is_alike(scrapy_env: dict[str, str], prefix: str, mongo_db: str,
                                                  tmp_path: Path) -> None:
    # Four real nodes, every pair as good (the built-in profile 'alike'). A busy node's crawl queue is empty most of
    # the time (it takes a subtask as soon as fewer pages wait in it than its slots start), so the nodes that
    # registered first kept every task's chain and one node crawled a twentieth of what the others did; the
    # allocation now gives work to idle nodes first (docs/strategies.md, step 6).
    out = tmp_path / "alike"
    result = run_scrapy(["experiment", "--profile", "alike", "--strategies", "dynamic", "--duration", "20",
                         "--machine-seconds", "0", "--out", str(out), "--prefix", prefix, "--database", mongo_db],
                        env=scrapy_env, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    nodes = json.loads((out / "summary.json").read_text(encoding="utf-8"))["runs"]["dynamic"]["nodes"]
    pages = {name: node["pages"] for name, node in nodes.items()}
    assert len(pages) == 4 and min(pages.values()) >= 0.4 * sum(pages.values()) / 4, pages


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_an_experiment_stopped_or_killed_stops_its_cluster(scrapy_env: dict[str, str], prefix: str, mongo_db: str,
                                                          tmp_path: Path, how: signal.Signals) -> None:
    # A supervisor, or kill, stops the command with SIGTERM in the middle of a run. Its nodes, control and simulated
    # web stop with it: left running, they went on crawling from the experiment's queues (into the next run's).
    # kill -9 gives the command no chance to stop them: the kernel tells them (services.die_with); until 2026-12-06
    # they crawled on for ever.
    proc = subprocess.Popen([sys.executable, "-m", "scrapy", "experiment", "--profile", "alike", "--strategies",
                             "dynamic", "--duration", "120", "--machine-seconds", "0", "--out", str(tmp_path / "out"),
                             "--prefix", prefix, "--database", mongo_db], cwd=PROJECT, env=scrapy_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    marker = f"SCHEDEXT_PREFIX={prefix}"
    running: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # until the 4 nodes and the control run
            running = psutil.Process(proc.pid).children(recursive=True)
            if sum(marker in _cmdline(p) for p in running) >= 5:
                break
            time.sleep(0.2)
        assert sum(marker in _cmdline(p) for p in running) >= 5, ([_cmdline(p) for p in running], proc.poll())
        proc.send_signal(how)
        _, err = proc.communicate(timeout=90)
        if how == signal.SIGTERM:
            assert proc.returncode == 130 and "interrupted" in err, err[-3000:]
        else:
            assert proc.returncode == -signal.SIGKILL
        psutil.wait_procs(running, timeout=30)
        assert [_cmdline(p) for p in running if _alive(p)] == []
    finally:
        proc.kill()
        for p in running:
            if _alive(p):
                p.kill()


def test_dynamic_beats_shared_on_a_heterogeneous_profile(scrapy_env: dict[str, str], prefix: str, mongo_db: str,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "exp"
    result = run_scrapy(["experiment", "--profile", str(DUEL), "--strategies", "dynamic,shared", "--duration", "20",
                         "--out", str(out), "--prefix", prefix, "--database", mongo_db], env=scrapy_env, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    # The documented shape (docs/experiment.md).
    assert {"v", "profile", "seed", "duration", "configurations", "nodes", "sites", "products", "corpus", "settings",
            "runs", "ratios", "goals", "gains"} <= set(summary)
    assert summary["configurations"] == ["dynamic", "shared"] and summary["duration"] == 20
    for name in ("dynamic", "shared"):
        run = summary["runs"][name]
        assert RUN_KEYS <= set(run)
        assert set(run["nodes"]) == {"node1", "node2"}
        for node in run["nodes"].values():
            assert NODE_KEYS <= set(node)
        assert run["items_over_time"][-1] == [20, run["unique_items"]]
        assert 0 < run["completion"] < 1 and not run["exhausted"]
    assert set(summary["ratios"]) == {"dynamic_vs_shared", "dynamic_vs_scrapy_redis", "dynamic_vs_oracle",
                                      "dynamic_vs_best", "oracle_vs_best"}
    assert summary["ratios"]["dynamic_vs_oracle"] is None and summary["ratios"]["dynamic_vs_scrapy_redis"] is None
    assert summary["goals"]["dynamic_vs_scrapy_redis>=1.5"] is None and summary["goals"]["dynamic_vs_shared>=1.5"]
    # The best possible bounds every configuration (docs/experiment.md, "vs best"), on the machine measured before
    # and after the configurations: each time two windows of plain Scrapy in as many processes as nodes, a page
    # dearer than an item; the bound uses each profile's cheapest window (the machine's fastest moment: a bound
    # must bound).
    assert 0 < summary["ratios"]["dynamic_vs_best"] < 1 and summary["simulated"] is False
    model = summary["best_possible"]["model"]
    assert model["source"].startswith("measured before and after the configurations (each profile's cheapest "
                                      "window): plain Scrapy in 2 processes"), model
    assert [w["when"] for w in model["windows"]] == ["before", "before", "after", "after"]
    # served as fast as the duel's quickest pair (a node on its own site: 0.05 s), the machine's cost at that pace
    assert {w["latency"] for w in model["windows"]} == {0.05} and "pages served in 0.05 s" in model["source"]
    assert all(w["pages"] > 100 and w["node_cpu"] > 0 for w in model["windows"])
    before, after = model["measured"]
    assert (before["when"], after["when"]) == ("before", "after")
    kept = fastest([model["windows"][:2], model["windows"][2:]])
    assert (model["machine_page_cpu"], model["machine_item_cpu"]) == (kept.page_cpu, kept.item_cpu)
    assert model["machine_page_cpu"] > model["machine_item_cpu"] > 0 and model["node_page_cpu"] > 0
    assert set(summary["gains"]["over_shared"]) == {"node1", "node2"}
    # The outcome: dynamic scheduling sends each site to the node it suits and collects clearly more.
    dynamic, shared = summary["runs"]["dynamic"], summary["runs"]["shared"]
    assert dynamic["unique_items"] > 1.2 * shared["unique_items"], (dynamic["unique_items"], shared["unique_items"])
    # (Not served share or pages per site: on this profile a shared queue's pages on the bad pairs mostly fail or
    # crawl slowly, so its *pages* are still mostly good ones; what it loses is time, which unique items measure.)
    for name in ("fig4.png", "fig4_shared.png", "fig5.png", "items.png", "report.html"):
        assert (out / name).stat().st_size > 1000
    assert "dynamic" in result.stdout and "summary:" in result.stdout


def test_the_machine_is_measured_at_the_latency_of_the_runs_quickest_pair_at_any_time() -> None:
    from product_crawl.experiment.machine import FAST_LATENCY, bound_latency
    from product_crawl.simweb.profile import parse_profile

    rule = {"share": 0.9, "latency": {"mean": 0.4}, "error_rate": 0.0, "block_rate": 0.0}
    profile = parse_profile({
        "name": "t", "default": {**rule, "latency": {"mean": 0.6}},
        "nodes": {"127.0.0.2": {"sites": {"a.cn": {**rule, "phases": [{"after": 30, "latency": {"mean": 0.15}}]},
                                          "b.cn": {"share": 0.0, "latency": {"mean": 0.01}},  # serves nothing
                                          "c.cn": {"error_rate": 0.6, "block_rate": 0.4,  # answers nothing
                                                   "latency": {"mean": 0.02}}}}}})
    # a.cn turns quick after 30 s: the run's quickest pages come from there, however late
    assert bound_latency(profile, ["127.0.0.2"], ["a.cn", "b.cn", "c.cn"]) == 0.15
    # a node the profile does not name is served by its default
    assert bound_latency(profile, ["127.0.0.9"], ["a.cn"]) == 0.6
    assert bound_latency(profile, [], ["a.cn"]) == FAST_LATENCY


def test_goal_lines_report_scrapy_redis_and_oracle_goals() -> None:
    from product_crawl.experiment.report import goal_lines

    summary = {"ratios": {"dynamic_vs_shared": 3.0, "dynamic_vs_scrapy_redis": 1.4, "dynamic_vs_oracle": 0.96,
                          "dynamic_vs_best": 0.5},
               "goals": {"dynamic_vs_shared>=1.5": True, "dynamic_vs_scrapy_redis>=1.5": False,
                         "dynamic_vs_oracle>=0.95": True, "dynamic_vs_best>=0.8": None},
               "best_possible": {"items": 1000}, "runs": {}}
    assert goal_lines(summary) == [
        "dynamic_vs_shared>=1.5: REACHED (dynamic / shared = 3.00)",
        "dynamic_vs_scrapy_redis>=1.5: NOT reached (dynamic / scrapy_redis = 1.40)",
        "dynamic_vs_oracle>=0.95: REACHED (dynamic / oracle = 0.96)",
        "dynamic_vs_best>=0.8: not measured (dynamic / best possible = 0.50, best possible 1000 unique items)"]


def test_machine_costs_are_solved_from_two_windows_and_refused_when_they_cannot_be() -> None:
    import doctest

    from product_crawl.experiment import machine

    result = doctest.testmod(machine)
    assert result.attempted > 0 and result.failed == 0
    same = {"pages": 100, "items": 500, "x_cpu": 1.0}
    with pytest.raises(machine.MachineError, match="same items a page"):
        machine.solve(same, {"pages": 200, "items": 1000, "x_cpu": 2.0}, ("x",))


@pytest.mark.parametrize(("value", "message"), [
    (None, "PC_PLAIN_PAGES: expected the path of a JSON list of result pages, got nothing"),
    ("/nonexistent/pages.json", "PC_PLAIN_PAGES='/nonexistent/pages.json': expected a JSON list of result pages"),
    ("{bad}", "expected a JSON list of {\"url\": str, \"meta\": {...}} entries"),
])
def test_the_plain_spider_names_a_bad_page_list_before_anything_opens(value: str | None, message: str,
                                                                      tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"url": 1}]), encoding="utf-8")
    args = ["crawl", "plain_search", "-s", "LOG_LEVEL=ERROR"]
    if value is not None:
        args += ["-s", f"PC_PLAIN_PAGES={str(bad) if value == '{bad}' else value}"]
    env = {"PATH": "/usr/bin:/bin", "MONGO_URI": "mongodb://127.0.0.1:1", "PC_MONGO_TIMEOUT": "1"}
    result = run_scrapy(args, env=env, timeout=60)
    assert result.returncode != 0
    assert message in result.stderr
    assert "ServerSelectionTimeoutError" not in result.stderr  # the list is read before the storage is opened


def test_an_experiment_wipes_only_what_an_experiment_made(cluster: Any, redis_url: str, mongo_uri: str,
                                                         tmp_path: Path) -> None:
    # A prefix or database given by mistake (a deployment's, under another name than its settings give) lost every
    # key or item there: before each configuration the experiment deletes its prefix's keys and drops its database.
    from product_crawl.experiment.runner import SCRATCH_MARK, wipe_scratch

    opts = make_options(profile="paper", strategies="dynamic", prefix=cluster.store.keys.prefix,
                        database=cluster.mongo_db, out=tmp_path / "out")
    someone = f"{opts.prefix}:waiting"
    cluster.redis.zadd(someone, {"a deployment's subtask": 1})
    with pytest.raises(ExperimentError, match=r"--prefix .*: Redis holds keys under it that no experiment made"):
        wipe_scratch(cluster, opts)
    assert cluster.redis.zcard(someone) == 1  # nothing deleted
    cluster.redis.delete(someone)
    cluster.mongo[opts.database]["items"].insert_one({"title": "a deployment's item"})
    with pytest.raises(ExperimentError, match=r"--database .*: it holds collections no experiment made \(items\)"):
        wipe_scratch(cluster, opts)
    assert cluster.mongo[opts.database]["items"].count_documents({}) == 1
    cluster.mongo.drop_database(opts.database)
    wipe_scratch(cluster, opts)  # empty: the experiment's now, marked
    assert cluster.redis.exists(f"{opts.prefix}:{SCRATCH_MARK}")
    assert SCRATCH_MARK in cluster.mongo[opts.database].list_collection_names()
    cluster.redis.zadd(someone, {"the experiment's own subtask": 1})
    cluster.mongo[opts.database]["items"].insert_one({"title": "the experiment's own item"})
    wipe_scratch(cluster, opts)  # marked: wiped, and marked again
    assert not cluster.redis.exists(someone) and cluster.mongo[opts.database]["items"].count_documents({}) == 0
    assert cluster.redis.exists(f"{opts.prefix}:{SCRATCH_MARK}")
