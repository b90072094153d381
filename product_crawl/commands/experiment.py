"""``scrapy experiment``: dynamic scheduling against its baselines on the simulated web (docs/experiment.md).

    scrapy experiment [--profile paper|FILE] [--duration SECONDS] [--strategies LIST] [--ablations] [--seed N]
                      [--out DIR] [--nodes N] [--set NAME=VALUE ...]
                      [--sim [--repeat N (default 3)] [--jobs N] [--products N]
                             [--profile generated:FAMILY [--sites N]]]

Runs each configuration in turn on a fresh local cluster for the same wall time and writes ``DIR/summary.json``,
``DIR/report.html`` and its PNG plots; prints a progress line on stderr while it runs and a table at the end.
Bad input (unknown configuration, invalid profile, too short a duration) exits with code 2 before anything
starts; services that cannot be used or a cluster that cannot start exit with code 1.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from scrapy.commands import ScrapyCommand

from product_crawl.commands._base import write_error, write_line
from product_crawl.experiment import CONFIGURATIONS, DEFAULT_CONFIGURATIONS, ExperimentError, make_options
from product_crawl.experiment.runner import (
    EXPERIMENT_DATABASE,
    EXPERIMENT_PREFIX,
    MIN_DURATION,
    SIM_REPEAT,
    parse_overrides,
)
from product_crawl.experiment.sim import PROFILE_FAMILIES, usable_cores
from product_crawl.services import integer, real
from scheduler_ext.keys import Keys


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # it runs clusters of separate processes, no crawler of its own
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return ("[--profile paper|FILE] [--duration SECONDS] [--strategies LIST] [--ablations] [--seed N] [--out DIR] "
                "[--machine-seconds SECONDS] "
                "[--sim [--repeat N] [--jobs N] [--products N] [--profile generated:FAMILY [--sites N]]]")

    def short_desc(self) -> str:
        return "Compare dynamic scheduling with its baselines on the simulated web (Figures 4 and 5)"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        # Scrapy's global --profile (cProfile output) is replaced by ours, as in ``scrapy simweb``; scrapy.cmdline
        # still reads opts.profile to decide whether to profile, so that attribute stays, always off.
        parser.add_argument("--profile", dest="simweb_profile", default="paper", metavar="paper|FILE",
                            help="simulated-web profile: built-in name or JSON file (default: paper); with --sim "
                                 "also generated:FAMILY, a generated world (FAMILY: "
                                 f"{', '.join(PROFILE_FAMILIES)}; docs/experiment.md)")
        parser.set_defaults(profile=None)
        parser.add_argument("--duration", type=real, default=90.0, metavar="SECONDS",
                            help=f"wall time of each configuration (simulated time with --sim), >= {MIN_DURATION:.0f} "
                                 "(default: 90)")
        parser.add_argument("--strategies", default=",".join(DEFAULT_CONFIGURATIONS), metavar="LIST",
                            help=f"comma-separated configurations from {', '.join(CONFIGURATIONS)} "
                                 f"(by default {','.join(DEFAULT_CONFIGURATIONS)})")
        parser.add_argument("--ablations", action="store_true",
                            help="also run dynamic with each strategy at its baseline (Figure 5)")
        parser.add_argument("--seed", type=integer, default=0, help="simulated-web seed (default: 0)")
        parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                            help="output folder (default: var/experiment/<timestamp>)")
        parser.add_argument("--nodes", type=integer, default=None, metavar="N",
                            help="crawl nodes (default: one per node of the profile)")
        parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                            help="a setting for every configuration's nodes and control, e.g. "
                                 "SCHEDEXT_RATE_FLOOR=0.8 (repeatable)")
        parser.add_argument("--sim", action="store_true",
                            help="run the configurations on the cluster simulator (no services, no processes)")
        parser.add_argument("--repeat", type=integer, default=None, metavar="N",
                            help="with --sim: runs per configuration (seeds SEED..SEED+N-1), for ratio distributions "
                                 f"(default: {SIM_REPEAT} with --sim, 1 otherwise)")
        parser.add_argument("--jobs", type=integer, default=None, metavar="N",
                            help="with --sim: runs at once, each in a process of its own (default: the cores this "
                                 "process may use, at most the runs)")
        parser.add_argument("--products", type=integer, default=None, metavar="N",
                            help="with --sim: N products searched on every site (the paper's four, then 'product 5' "
                                 "..; default: the paper's four)")
        parser.add_argument("--sites", type=integer, default=None, metavar="N",
                            help="with --profile generated:FAMILY: its number of sites (default 8; --nodes: its "
                                 "nodes, default 12)")
        parser.add_argument("--machine-seconds", type=real, default=None, metavar="SECONDS",
                            help="a real run: measure this machine (plain Scrapy, two windows of SECONDS) before "
                                 "and after the configurations, for the best possible; 0 uses the recorded "
                                 "benchmarks/results/bench_machine.json (default: 10)")
        parser.add_argument("--prefix", default=EXPERIMENT_PREFIX,
                            help=f"Redis key prefix of the runs; default {EXPERIMENT_PREFIX}")
        parser.add_argument("--database", default=EXPERIMENT_DATABASE,
                            help=f"MongoDB database of the runs; default {EXPERIMENT_DATABASE}")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        from product_crawl.experiment import run_experiment
        from product_crawl.services import ServiceError, Services

        assert self.settings is not None
        if args:
            write_error(f"unexpected arguments: {' '.join(args)} (options only; see --help)")
            self.exitcode = 2
            return
        try:
            options = make_options(profile=opts.simweb_profile, duration=opts.duration, strategies=opts.strategies,
                                   ablations=opts.ablations, seed=opts.seed, out=opts.out, nodes=opts.nodes,
                                   overrides=parse_overrides(opts.overrides), prefix=opts.prefix,
                                   database=opts.database, sim=opts.sim,
                                   repeat=opts.repeat if opts.repeat is not None else SIM_REPEAT if opts.sim else 1,
                                   products=opts.products,
                                   sites=opts.sites, machine_seconds=opts.machine_seconds,
                                   jobs=opts.jobs if opts.jobs is not None else usable_cores() if opts.sim else 1)
        except ExperimentError as exc:
            write_error(str(exc))
            self.exitcode = 2
            return
        deployment = {"--prefix": (options.prefix, self.settings.get("SCHEDEXT_PREFIX") or Keys().prefix),
                      "--database": (options.database, self.settings.get("MONGO_DATABASE"))}
        for option, (given, own) in deployment.items():
            if not options.sim and given == own:  # wiped before each configuration: the deployment's own state
                write_error(f"{option} {given!r}: that is this project's deployment's (its settings say so), and an "
                            f"experiment wipes its {option[2:]} before each configuration; give it one of its own")
                self.exitcode = 2
                return
        if options.sim:
            write_line(f"experiment (simulated): {', '.join(options.configurations)} on profile "
                       f"{options.profile.name!r}, {options.duration:.0f} s each, {len(options.nodes)} nodes x "
                       f"{len(options.sites)} sites x {len(options.products)} products, {options.repeat} seed(s) "
                       f"from {options.seed}, {options.jobs} at once; output in {options.out}")
            try:
                summary, report = run_experiment(options)
            except ExperimentError as exc:  # a run that failed or was killed; an output folder that cannot be made
                write_error(str(exc))
                self.exitcode = 1
                return
            self._print(summary, options, report)
            return
        services = Services(self.settings)
        try:
            services.claim(options.prefix, "scrapy experiment")  # before anything starts: a refusal changes nothing
            started_here = any(state.detail == "started" for state in services.start())
        except ServiceError as exc:
            write_error(str(exc))
            self.exitcode = 1
            return
        write_line(f"experiment: {', '.join(options.configurations)} on profile {options.profile.name!r}, "
                   f"{options.duration:.0f} s each, {len(options.nodes)} nodes, seed {options.seed}; "
                   f"output in {options.out}")
        previous = signal.signal(signal.SIGTERM, _interrupt)  # kill (a supervisor's stop) as Ctrl-C
        try:
            summary, report = run_experiment(options, redis_url=services.redis_url, mongo_uri=services.mongo_uri)
        except ExperimentError as exc:
            write_error(str(exc))
            self.exitcode = 1
            return
        except KeyboardInterrupt:  # the running cluster was stopped by run_configuration's finally
            write_error("interrupted; the configurations that finished are in " + str(options.out / "raw"))
            self.exitcode = 130
            return
        finally:
            signal.signal(signal.SIGTERM, previous)
            if started_here and services.stop_unless_used() is None:  # like the demo: leave running only what was
                write_line("leaving Redis and MongoDB running: another command uses them")  # running before
        self._print(summary, options, report)

    @staticmethod
    def _print(summary: dict[str, Any], options: Any, report: Path) -> None:
        from product_crawl.experiment.report import console_table

        write_line("")
        for line in console_table(summary):
            write_line(line)
        write_line("")
        write_line(f"summary: {options.out / 'summary.json'}")
        write_line(f"report:  {report}")


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM handled as Ctrl-C: the cleanup of the run in progress stops its nodes, control and simulated web.
    Python's default for SIGTERM ends the process at once, without it, and they went on crawling from the
    experiment's queues (into the next run's, when one was started with the same prefix)."""
    raise KeyboardInterrupt
