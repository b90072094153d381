"""``scrapy cluster deploy|up|status|down``: drive the scrapyd daemons of several crawl machines (docs/deploy.md).

Targets are the ``[deploy:NAME]`` sections of ``scrapy.cfg`` (credentials from there, ``${VAR}`` from the
environment, or ``.netrc``; never from the command line). Secrets for the jobs (``REDIS_URL``, ``MONGO_URI``) live
in each scrapyd daemon's environment: job settings become command-line arguments, which ``ps`` shows.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
import time
from pathlib import Path
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.utils.conf import closest_scrapy_cfg

from product_crawl.commands._base import open_store, seconds, write_error, write_line
from product_crawl.commands.status import table as table_lines
from product_crawl.deploy.plan import job_id, job_rows, name_of, parse_nodes, parse_settings, plan_jobs
from product_crawl.deploy.scrapyd import (
    DeployError,
    ScrapydClient,
    Target,
    build_egg,
    read_targets,
    write_scrapyd_config,
)
from product_crawl.services import checked, generate_password, integer, tcp_port, whole_number
from scheduler_ext.defaults import setting_float
from scheduler_ext.status import collect_status
from scheduler_ext.store import lease_node

ACTIONS = ("deploy", "up", "status", "down", "scrapyd-config")


# argparse types: an ArgumentTypeError's message is shown as ``argument --OPTION: <message>``.
def scrapyd_port(value: str) -> int:
    """A port for scrapyd: 1 .. 65535; not 0, which picks a port that no scrapy.cfg target could name.

    >>> scrapyd_port("6800")
    6800
    """
    try:
        port = tcp_port(value)
    except argparse.ArgumentTypeError:
        port = 0
    if port == 0:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1 .. 65535, got {value!r}")
    return port


def max_proc(value: str) -> int:
    """scrapyd's ``max_proc``: jobs at once, at least 1 (scrapyd reads 0 as "4 per CPU", not as none).

    >>> max_proc("16")
    16
    """
    return int(checked(value, whole_number, lambda n: n >= 1,
                       "a whole number of jobs >= 1"))


def bind_address(value: str) -> str:
    """The IP address scrapyd listens on (scrapyd's ``bind_address`` is an address, not a host name).

    >>> bind_address("0.0.0.0"), bind_address("::1")
    ('0.0.0.0', '::1')
    """
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address to listen on (e.g. 127.0.0.1, 0.0.0.0 or ::), "
                                         f"got {value!r}") from None


def grace_seconds(value: str) -> float:
    """``down --timeout``: a finite number of seconds >= 0, at most a day (NaN would make every job look overdue
    at once).

    >>> grace_seconds("30"), grace_seconds("0")
    (30.0, 0.0)
    """
    return seconds(value, zero=True)


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "deploy|up|status|down [options] | scrapyd-config DIR [--bind ADDRESS] [--port N]"

    def short_desc(self) -> str:
        return "Deploy to scrapyd targets and start, show or stop the cluster's nodes and controls there"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--target", action="append", default=[], metavar="NAME",
                            help="deploy, status, down: only this target of scrapy.cfg (repeatable; default: all)")
        parser.add_argument("--version", default=None, help="deploy: the version name (default: a time stamp)")
        parser.add_argument("--nodes", default=None, metavar="TARGET=N,...",
                            help="up: crawl nodes per target (plus one control and one standby)")
        parser.add_argument("--controls", type=integer, default=2, choices=(0, 1, 2),
                            help="up: controls to run: a leader and a standby (default 2)")
        # Its own dest: Scrapy's -s NAME=VALUE stays this command's own setting (REDIS_URL for status, ...),
        # while --set (which the conflict handler takes over from Scrapy's -s/--set) is for the jobs.
        parser.add_argument("--set", dest="job_settings", action="append", default=[], metavar="NAME=VALUE",
                            help="up: a setting for every job (no secrets: scrapyd shows them in ps); "
                                 "-s NAME=VALUE sets this command's own settings")
        parser.add_argument("--only", action="append", default=[], metavar="NAME",
                            help="down: only this node or control id (repeatable), e.g. for a rolling upgrade")
        parser.add_argument("--timeout", type=grace_seconds, default=60.0,
                            help="down: seconds a job gets to stop gracefully before it is killed (default 60)")
        parser.add_argument("--json", action="store_true", help="status: one JSON object")
        parser.add_argument("--bind", type=bind_address, default="127.0.0.1",
                            help="scrapyd-config: IP address to listen on (default loopback)")
        parser.add_argument("--port", type=scrapyd_port, default=6800,
                            help="scrapyd-config: HTTP port, 1 .. 65535 (default 6800)")
        parser.add_argument("--max-proc", type=max_proc, default=16,
                            help="scrapyd-config: max_proc, >= 1 (default 16)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args or args[0] not in ACTIONS or len(args) != (2 if args[0] == "scrapyd-config" else 1):
            raise UsageError(f"expected one of: {', '.join(ACTIONS)} (scrapyd-config takes a folder)")
        if args[0] == "scrapyd-config":
            self._scrapyd_config(args[1], opts)
            return
        try:
            targets = read_targets()
            chosen = self._chosen(targets, opts.target)
            getattr(self, f"_{args[0]}")(targets, chosen, opts)
        except DeployError as exc:
            write_error(str(exc))
            self.exitcode = 1

    @staticmethod
    def _chosen(targets: dict[str, Target], names: list[str]) -> list[Target]:
        if not targets:
            raise DeployError("scrapy.cfg has no [deploy:NAME] target with a url")
        unknown = [n for n in names if n not in targets]
        if unknown:
            raise DeployError(f"--target: unknown {', '.join(map(repr, unknown))}; scrapy.cfg has: "
                              f"{', '.join(sorted(targets))}")
        chosen = [targets[n] for n in names] if names else list(targets.values())
        for t in chosen:
            if not t.username:
                sys.stderr.write(f"warning: target {t.describe()} has no credentials: a scrapyd without "
                                 "authentication runs any code anyone who reaches it uploads\n")
        return chosen

    # --- scrapyd-config ---------------------------------------------------------------------------------------
    def _scrapyd_config(self, name: str, opts: argparse.Namespace) -> None:
        """A scrapyd.conf with a generated password (mode 0600), loopback unless --bind; prints no secret."""
        folder = Path(name)
        if not name or (folder.exists() and not folder.is_dir()):
            raise UsageError(f"DIR {name!r}: expected a folder (new or existing) for scrapyd.conf", print_help=False)
        if (folder / "scrapyd.conf").exists():  # a new password would lock out everyone using the old one
            write_error(f"{folder / 'scrapyd.conf'} already exists; remove it to write a new one")
            self.exitcode = 1
            return
        try:
            path = write_scrapyd_config(folder / "scrapyd.conf", port=opts.port, username="pc-operator",
                                        password=generate_password(), bind_address=opts.bind,
                                        max_proc=opts.max_proc)
        except OSError as exc:  # the folder cannot be made or written: a file on its path, no permission, ...
            write_error(f"DIR {name!r}: cannot write scrapyd.conf there: {exc.strerror or exc}")
            self.exitcode = 1
            return
        write_line(f"wrote {path} (mode 0600): scrapyd on {opts.bind}:{opts.port}, user pc-operator, a generated "
                   f"password; start it with `scrapyd` in {folder}, and take the password for scrapy.cfg with\n"
                   f"  export PC_SCRAPYD_PASSWORD=\"$(sed -n 's/^password = //p' {path})\"")

    # --- deploy ----------------------------------------------------------------------------------------------
    def _deploy(self, targets: dict[str, Target], chosen: list[Target], opts: argparse.Namespace) -> None:
        egg = build_egg(Path(closest_scrapy_cfg()).parent)
        version = opts.version or str(int(time.time()))
        for t in chosen:
            spiders = ScrapydClient(t).add_version(version, egg)
            write_line(f"deployed {t.project} version {version} to {t.describe()}: {spiders} spiders")

    # --- up --------------------------------------------------------------------------------------------------
    def _up(self, targets: dict[str, Target], chosen: list[Target], opts: argparse.Namespace) -> None:
        if not opts.nodes:
            raise UsageError("up needs --nodes TARGET=N[,TARGET=N...]")
        jobs = plan_jobs(parse_nodes(opts.nodes, targets), targets, parse_settings(opts.job_settings), opts.controls)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        active = {t: self._active_names(ScrapydClient(targets[t])) for t in {j.target for j in jobs}}
        for job in jobs:
            target = targets[job.target]
            if (state := active[job.target].get(job.name)) is not None:
                write_line(f"{job.name:24} {job.spider:8} on {target.describe()}: already {state}")
                continue
            jid = ScrapydClient(target).schedule(job.spider, job_id(job.name, stamp), job.settings)
            write_line(f"{job.name:24} {job.spider:8} on {target.describe()}: scheduled as job {jid}")

    @staticmethod
    def _active_names(client: ScrapydClient) -> dict[str, str]:
        jobs = client.listjobs()
        return {name: state for state in ("pending", "running") for j in jobs[state]
                if (name := name_of(str(j["id"]))) is not None}

    # --- status ----------------------------------------------------------------------------------------------
    def _status(self, targets: dict[str, Target], chosen: list[Target], opts: argparse.Namespace) -> None:
        jobs: dict[str, Any] = {}
        for t in chosen:
            try:
                jobs[t.name] = ScrapydClient(t).listjobs()
            except DeployError as exc:  # one machine down: show the others, exit 1
                write_error(str(exc))
                self.exitcode = 1
                jobs[t.name] = {}
        snapshot = self._snapshot()
        rows = job_rows(jobs, snapshot["nodes"] if snapshot else [])
        if opts.json:
            queues = snapshot["queues"] if snapshot else None
            write_line(json.dumps({"jobs": rows, "queues": queues}, ensure_ascii=False, sort_keys=True))
            return
        headers = ["target", "job", "spider", "state", "pid", "node", "alive", "subtasks"]
        table = [[str(r["target"]), str(r["job"]), str(r["spider"]), r["state"], str(r["pid"] or "-"),
                  str(r["name"] or "-"), "-" if r["alive"] is None else ("yes" if r["alive"] else "no"),
                  ",".join(r["subtasks"]) or "-"] for r in rows]
        for line in table_lines(headers, table):
            write_line(line)
        if snapshot:
            q = snapshot["queues"]
            write_line(f"queues: virtual {q['virtual']}  waiting {q['waiting']}  leased {q['leased']}  "
                       f"sleeping {q['sleeping']}  failed {q['failed']}  dead {q['dead']}")

    def _snapshot(self) -> dict[str, Any] | None:
        assert self.settings is not None
        store = open_store(self.settings)  # None after an error naming the server
        if store is None:
            self.exitcode = 1
            return None
        return collect_status(store, setting_float(self.settings, "SCHEDEXT_RECALL_THRESHOLD"))

    # --- down ------------------------------------------------------------------------------------------------
    def _down(self, targets: dict[str, Target], chosen: list[Target], opts: argparse.Namespace) -> None:
        found: list[tuple[ScrapydClient, dict[str, Any]]] = []
        for t in chosen:
            client = ScrapydClient(t)
            lists = client.listjobs()
            for job in lists["pending"] + lists["running"]:
                if not opts.only or name_of(str(job["id"])) in opts.only:
                    found.append((client, job))
        # Nodes first: each returns its leases and crawl queue to waiting while the controls still run.
        for spider_first in (True, False):
            batch = [(c, j) for c, j in found if (j.get("spider") != "control") == spider_first]
            if batch:
                self._stop(batch, opts.timeout)
        if not found:
            write_line("no pending or running job")
        self._left(set(opts.only) if opts.only else None)

    def _left(self, names: set[str] | None) -> None:
        """What the stopped nodes (``names``; None: the whole cluster) still hold: it should be nothing."""
        assert self.settings is not None
        store = open_store(self.settings)  # None after an error naming the server
        if store is None:
            self.exitcode = 1
            return
        q = collect_status(store, setting_float(self.settings, "SCHEDEXT_RECALL_THRESHOLD"))["queues"]
        owners = [lease_node(raw) for raw in store.redis.hvals(store.keys.lease_info)]
        leased = sum(1 for node in owners if names is None or node in names)
        crawl = sum(n for node, n in q["crawl"].items() if names is None or node in names)
        who = "" if names is None else f"by {', '.join(sorted(names))}: "
        write_line(f"{who}leased {leased}  in crawl queues {crawl}  waiting {q['waiting']}")
        if leased or crawl:
            write_line("a control recalls what is left after SCHEDEXT_RECALL_THRESHOLD once one runs again")

    def _stop(self, batch: list[tuple[ScrapydClient, dict[str, Any]]], timeout: float) -> None:
        for client, job in batch:
            state = client.cancel(str(job["id"]), "INT")  # Scrapy's graceful shutdown, like Ctrl-C
            write_line(f"{job['id']:40} on {client.target.describe()}: stopping (was {state or 'gone'})")
        waiting = {(c.target.name, str(j["id"])): c for c, j in batch}
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            time.sleep(0.5)
            for client in {id(c): c for c in waiting.values()}.values():
                lists = client.listjobs()
                live = {str(j["id"]) for j in lists["pending"] + lists["running"]}
                for key in [k for k, c in waiting.items() if c is client and k[1] not in live]:
                    del waiting[key]
                    write_line(f"{key[1]:40} on {client.target.describe()}: stopped")
        for (_, jid), client in waiting.items():
            client.cancel(jid, "KILL")
            write_line(f"{jid:40} on {client.target.describe()}: killed after {timeout:.0f} s")
