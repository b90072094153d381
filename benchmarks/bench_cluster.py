"""Where a real experiment's CPU and time go: CPU seconds per process and the critical path of a task.

Run: ``.venv/bin/python benchmarks/bench_cluster.py [--out FILE] [EXPERIMENT OPTIONS]``, for example
``.venv/bin/python benchmarks/bench_cluster.py --profile paper --strategies dynamic --duration 60``. The options
after the script's own are passed to ``scrapy experiment`` as they are (``--out`` of the experiment: ``--exp-out``).

It starts a private Redis and nx-27017 on free ports (as the other benchmarks do), runs the experiment against them,
and while each configuration runs (from the start of its simulated web to its end) samples ``/proc`` every 0.5 s:

* CPU seconds (user + system, every thread) of each process: the four nodes, the control, the simulated web,
  redis-server, nx-27017 and the experiment runner itself, over the configuration's window (the control and the
  web start in it, so their start-up counts; the nodes' does not);
* the web's requests and the run's unique items, hence CPU milliseconds per request and per item;
* from the ``runs`` stream, the critical path of a task: a task's next subtask exists only once the previous one
  is finished and a tick has read its report, so a task's pages per second are its subtask size over the sum of
  (created -> taken: waiting, allocation, the node's pickup), (taken -> completed: downloads, parsing, storage),
  (completed -> finish accepted by Redis) and (finish -> next subtask created: the control's tick).

Prints one line per configuration and, last, one JSON object, also written to ``--out``
(default ``benchmarks/results/bench_cluster.json``). docs/experiment.md reads the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from product_crawl import services  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "bench_cluster.json"
TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds so far) of a process, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TCK


def _role(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    text = " ".join(a.decode(errors="replace") for a in argv)
    if "product_crawl.simweb" in text:
        return "simweb"
    if " crawl control" in text:
        return "control"
    if " crawl search" in text or " crawl redis_search" in text:
        ids = [a.decode().split("=", 1)[1] for a in argv if a.startswith(b"SCHEDEXT_NODE_ID=")]
        return ids[0] if ids else "node"
    if "redis-server" in text:
        return "redis"
    if "nx-27017" in text:
        return "mongo"
    return "runner" if "experiment" in text else "other"


def _tree(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            children[st[0]].append(int(d.name))
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _quantiles(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    xs = sorted(xs)
    return {"median": round(statistics.median(xs), 3), "mean": round(statistics.mean(xs), 3),
            "p90": round(xs[int(0.9 * (len(xs) - 1))], 3)}


def critical_path(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The gaps along each task's chain of subtasks, from the run records (reports) and their stream ids."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_task[r["subtask"]["task"]].append(r)
    waiting, crawling, finishing, ticking = [], [], [], []
    for chain in by_task.values():
        chain.sort(key=lambda r: r["started"])
        for r in chain:
            waiting.append(r["started"] - r["subtask"]["since"])
            crawling.append(r["ended"] - r["started"])
            finishing.append(r["accepted"] - r["ended"])
        ticking += [b["subtask"]["since"] - a["accepted"] for a, b in zip(chain, chain[1:], strict=False)]
    return {"runs": len(runs), "tasks": len(by_task),
            "pages_per_run": _quantiles([float(r["pages"]) for r in runs]),
            "created_to_taken": _quantiles(waiting), "taken_to_completed": _quantiles(crawling),
            "completed_to_accepted": _quantiles(finishing), "accepted_to_next_created": _quantiles(ticking)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--exp-out", type=Path, default=None, help="the experiment's own --out folder")
    args, experiment = parser.parse_known_args()
    if not any(a.startswith("--machine-seconds") for a in experiment):
        # The experiment's machine measurement (plain Scrapy, its own web and nx-27017) would be sampled as if it
        # were a configuration's window; its bound uses the recorded machine instead (docs/experiment.md).
        experiment += ["--machine-seconds", "0"]
    import redis

    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as d:
        tmp = Path(d)
        redis_port, mongo_port = services.free_port(), services.free_port()
        redis_proc = services.start_redis_server(redis_port, tmp / "redis")
        mongo_proc = services.start_mongo_server(mongo_port, tmp / "mongo")
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        exp_out = args.exp_out or tmp / "experiment"
        prefix = "{bench-cluster}"
        env = {**os.environ, "REDIS_URL": redis_url, "MONGO_URI": f"mongodb://127.0.0.1:{mongo_port}"}
        argv = [str(Path(sys.executable).parent / "scrapy"), "experiment", *experiment, "--out", str(exp_out),
                "--prefix", prefix]
        windows: list[dict[str, Any]] = []
        try:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env)
            roles: dict[int, str] = {}
            current: dict[str, Any] | None = None
            while proc.poll() is None:
                cpu = {}
                for pid in _tree([proc.pid, redis_proc.pid, mongo_proc.pid]):
                    st = _stat(pid)
                    if st is not None:
                        roles.setdefault(pid, _role(pid))
                        cpu[pid] = st[1]
                web = any(roles[p] == "simweb" for p in cpu)
                if web and current is None:
                    current = {"t0": time.monotonic(), "start": dict(cpu), "last": dict(cpu), "runs": {}}
                if current is not None:
                    if web:
                        current["last"].update(cpu)
                        current["t1"] = time.monotonic()
                        last_id = max(current["runs"], default="0-0")
                        for rid, fields in client.xrange(f"{prefix}:runs", min=f"({last_id}"):
                            current["runs"][rid] = fields["report"]
                    else:
                        windows.append(current)
                        current = None
                time.sleep(0.5)
            if current is not None:
                windows.append(current)
            if proc.returncode:
                raise SystemExit(f"scrapy experiment exited with {proc.returncode}")
        finally:
            client.close()
            services.stop_pid(redis_proc.pid)
            services.stop_pid(mongo_proc.pid)
        summary = json.loads((exp_out / "summary.json").read_text())
        out: dict[str, Any] = {"argv": experiment, "configurations": {}}
        for name, w in zip(summary["configurations"], windows, strict=False):
            per: dict[str, float] = defaultdict(float)
            for pid, c in w["last"].items():
                # A process that started inside the window (control, web) counts from zero; one that started
                # later than the first sample after its birth is missed by at most one sample (0.5 s).
                per[roles[pid]] += c - w["start"].get(pid, 0.0 if roles[pid] in ("control", "simweb") else c)
            raw = json.loads((exp_out / "raw" / f"{name}.json").read_text())
            requests = sum(int(v.get("requests", 0)) for v in raw["web"].get("by_address", {}).values())
            run = summary["runs"][name]
            items = int(run["unique_items"])
            total = sum(per.values())
            seconds = w["t1"] - w["t0"]
            reports = []
            for rid, text in w["runs"].items():
                r = json.loads(text)
                r["accepted"] = int(rid.split("-")[0]) / 1000
                reports.append(r)
            out["configurations"][name] = {
                "window_s": round(seconds, 1), "cpu_s": {k: round(v, 2) for k, v in sorted(per.items())},
                "cpu_total_s": round(total, 1), "cpu_share": round(total / seconds, 2),
                "requests": requests, "unique_items": items, "vs_best": run.get("vs_best"),
                "cpu_ms_per_request": round(1000 * total / max(1, requests), 1),
                "node_cpu_ms_per_request": round(1000 * sum(v for k, v in per.items() if k.startswith("node"))
                                                 / max(1, requests), 1),
                "critical_path": critical_path(reports)}
            c = out["configurations"][name]
            path = c["critical_path"]
            print(f"{name}: {items} unique items, {requests} requests, CPU {total:.1f} s in {seconds:.0f} s "
                  f"({100 * total / seconds:.0f} % of one core), {c['cpu_ms_per_request']} ms a request "
                  f"(nodes {c['node_cpu_ms_per_request']}); per process {c['cpu_s']}; task path medians: created->"
                  f"taken {(path['created_to_taken'] or {}).get('median')} s, taken->completed "
                  f"{(path['taken_to_completed'] or {}).get('median')} s, completed->accepted "
                  f"{(path['completed_to_accepted'] or {}).get('median')} s, accepted->next "
                  f"{(path['accepted_to_next_created'] or {}).get('median')} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
