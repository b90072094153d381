"""Running the experiment: one fresh cluster per configuration, sampled over the same wall time.

For each configuration in turn: delete the experiment's Redis keys and MongoDB database, start the crawl nodes
(one ``scrapy crawl search`` process per node, each bound to its own loopback address) and wait until every node
heartbeats, then start a fresh simulated web (so its phase clock starts at 0 for every configuration), inject the
products and start the control. The run's clock starts with the simulated web; every ``sample_interval`` seconds
the runner records the unique items in MongoDB and the cumulative offered / collected results and runs per
(node, site) from ``collect_status``; at ``duration`` seconds it takes the final sample and stops everything.

What is compared is therefore the same profile, seed, products, nodes and wall time under each configuration's
strategies; docs/experiment.md describes the metrics and the summary schema.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from product_crawl.cluster import LocalCluster, NodeSpec
from product_crawl.services import free_port
from product_crawl.simweb.corpus import corpus_size
from product_crawl.simweb.profile import Profile, ProfileError, load_profile
from product_crawl.simweb.server import SimWebProcess
from product_crawl.tasks import keywords_for

logger = logging.getLogger(__name__)

_ALLOC = "scheduler_ext.strategies.allocation."
_MOD = "scheduler_ext.strategies.modification."
_RECALL = "scheduler_ext.strategies.recall."
_BANDIT = "scheduler_ext.strategies.bandit."

#: Configuration name -> (what it is, the strategy settings it sets on nodes and control).
CONFIGURATIONS: dict[str, tuple[str, dict[str, str]]] = {
    "dynamic": ("the defaults: bandit allocation, the paper's modification on completion relative to the site's "
                "best, the paper's recall (a failed run that crawled pages starts the count over)", {}),
    "shared": ("one shared FIFO queue, fixed subtask size, no recall (what scrapy-redis does)",
               {"SCHEDEXT_ALLOCATION": _ALLOC + "SharedAllocation",
                "SCHEDEXT_MODIFICATION": _MOD + "FixedModification",
                "SCHEDEXT_RECALL": _RECALL + "NoRecall"}),
    "round_robin": ("static assignment of each task to one node, fixed subtask size, no recall",
                    {"SCHEDEXT_ALLOCATION": _ALLOC + "RoundRobinAllocation",
                     "SCHEDEXT_MODIFICATION": _MOD + "FixedModification",
                     "SCHEDEXT_RECALL": _RECALL + "NoRecall"}),
    "oracle": ("dynamic scheduling with the true rates from the simulated web's profile (an upper bound)",
               {"SCHEDEXT_ALLOCATION": "product_crawl.oracle.OracleAllocation",
                "SCHEDEXT_MODIFICATION": _MOD + "RelativeModification",
                "SCHEDEXT_RECALL": _RECALL + "DynamicRecall"}),
    "scrapy_redis": ("scrapy-redis itself: RedisSpider nodes on its shared queue and dupefilter (JSON), all of a "
                     "query's pages queued once its first page is parsed; no control", {}),
    "no_allocation": ("dynamic with allocation switched to its baseline (shared queue)",
                      {"SCHEDEXT_ALLOCATION": _ALLOC + "SharedAllocation"}),
    "no_modification": ("dynamic with modification switched to its baseline (fixed subtask size)",
                        {"SCHEDEXT_MODIFICATION": _MOD + "FixedModification"}),
    "no_recall": ("dynamic with recall switched to its baseline (none)",
                  {"SCHEDEXT_RECALL": _RECALL + "NoRecall"}),
    "paper": ("the paper's dynamic allocation (moving averages, staleness timer), dynamic modification and recall "
              "(every recall counts)",
              {"SCHEDEXT_ALLOCATION": _ALLOC + "DynamicAllocation",
               "SCHEDEXT_MODIFICATION": _MOD + "DynamicModification",
               "SCHEDEXT_RECALL_RESET": "False"}),
    "bandit": ("bandit allocation (posteriors with uncertainty, Thompson exploration on a budget), the paper's "
               "modification and the default recall", {"SCHEDEXT_ALLOCATION": _BANDIT + "BanditAllocation"}),
}
DEFAULT_CONFIGURATIONS = ("dynamic", "shared", "round_robin", "oracle")
ABLATIONS = {"allocation": "no_allocation", "modification": "no_modification", "recall": "no_recall"}

#: Settings of every configuration's nodes and control: short intervals so that a run of a minute or two
#: learns something, identical for all configurations so that only the strategies differ.
CLUSTER_SETTINGS: dict[str, Any] = {
    "SCHEDEXT_HEARTBEAT_INTERVAL": 2,
    "SCHEDEXT_RECALL_THRESHOLD": 20,
    "SCHEDEXT_TICK_INTERVAL": 0.5,
    "SCHEDEXT_PATIENCE": 10,
    "SCHEDEXT_ESTIMATE_STALE": 60,
    "LOG_LEVEL": "INFO",
    "LOGSTATS_INTERVAL": 30.0,
}

#: The paper's Table 2: four dairy products, each searched on every site of the profile.
PRODUCTS: tuple[dict[str, str], ...] = (
    {"name": "光明高钙牛奶"},
    {"name": "特仑苏", "brand": "蒙牛"},
    {"name": "蒙牛早餐奶"},
    {"name": "雀巢中老年奶粉"},
)

#: The Redis key prefix and MongoDB database of the runs unless ``--prefix`` / ``--database`` say otherwise: the
#: experiment's scratch space by name (:func:`wipe_scratch`; experiments made before its mark left them unmarked).
EXPERIMENT_PREFIX, EXPERIMENT_DATABASE = "{exp}", "product_crawl_experiment"
MIN_DURATION = 20.0  # seconds; below this the nodes barely start, and no estimate rests on data
MAX_DURATION = 7 * 86400.0  # seconds: a week; a longer run is a typo (1e9 s would run, real or simulated, for ever)
SIM_REPEAT = 3  # seeds a simulated experiment runs unless --repeat says otherwise: a distribution, not one number
MACHINE_SECONDS = 10.0  # each of the two windows measuring the machine (product_crawl.experiment.machine)
MAX_MACHINE_SECONDS = 120.0
STARTUP_TIMEOUT = 90.0  # seconds the nodes get to start and heartbeat (Scrapy start-up on a busy 2-core box)
WINDOW = 10.0  # seconds over which the measured completion of Figure 4 is computed


class ExperimentError(Exception):
    """Raised if the experiment's input is bad or its cluster cannot start; the message says which and why."""


@dataclass
class Options:
    """What one ``scrapy experiment`` invocation runs. Build with :func:`make_options`, which validates."""

    profile_spec: str
    profile: Profile
    duration: float
    configurations: list[str]
    seed: int = 0
    out: Path = Path("var/experiment")
    nodes: list[NodeSpec] = field(default_factory=list)
    sites: list[str] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)
    sample_interval: float = 3.0
    prefix: str = EXPERIMENT_PREFIX
    database: str = EXPERIMENT_DATABASE
    sim: bool = False  # run on the cluster simulator (scheduler_ext.sim) instead of real processes
    repeat: int = 1  # simulated runs per configuration (seeds seed .. seed + repeat - 1), for ratio distributions
    products: tuple[dict[str, str], ...] = PRODUCTS  # searched on every site (more than the paper's four: --sim)
    # A real run: seconds of each window measuring the machine before the configurations (0: the recorded figures
    # of benchmarks/results/bench_machine.json); docs/experiment.md, "vs best".
    machine_seconds: float = 0.0
    jobs: int = 1  # simulated runs at once, each in a process of its own (a real run's share the machine: one)


def parse_configurations(spec: str, ablations: bool = False) -> list[str]:
    """The configuration names of a comma-separated ``spec``, in order, plus the ablation runs if asked.

    >>> parse_configurations("dynamic, shared")
    ['dynamic', 'shared']
    >>> parse_configurations("shared", ablations=True)
    ['shared', 'dynamic', 'no_allocation', 'no_modification', 'no_recall']
    >>> parse_configurations("dynamic,fifo")
    Traceback (most recent call last):
    ...
    product_crawl.experiment.runner.ExperimentError: --strategies: unknown configuration 'fifo'; expected \
names from: dynamic, shared, round_robin, oracle, scrapy_redis, no_allocation, no_modification, no_recall
    """
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names and not ablations:
        raise ExperimentError("--strategies: expected at least one configuration name, got none")
    for name in names:
        if name not in CONFIGURATIONS:
            raise ExperimentError(f"--strategies: unknown configuration {name!r}; expected names from: "
                                  f"{', '.join(CONFIGURATIONS)}")
    if ablations:
        names += ["dynamic", *ABLATIONS.values()]
    return list(dict.fromkeys(names))


def parse_overrides(values: Sequence[str]) -> dict[str, Any]:
    """``NAME=VALUE`` strings (``--set``) as a dict; values that are JSON numbers become numbers.

    >>> parse_overrides(["SCHEDEXT_RATE_FLOOR=0.8", "SCHEDEXT_PREFETCH=2"])
    {'SCHEDEXT_RATE_FLOOR': 0.8, 'SCHEDEXT_PREFETCH': 2}
    """
    out: dict[str, Any] = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name.strip():
            raise ExperimentError(f"--set: expected NAME=VALUE, got {value!r}")
        try:
            out[name.strip()] = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            out[name.strip()] = text
    return out


def profile_sites(profile: Profile) -> list[str]:
    """Every site some node of the profile names, in order of first appearance."""
    return list(dict.fromkeys(site for node in profile.nodes.values() for site in node.sites))


def experiment_nodes(profile: Profile, count: int | None) -> list[NodeSpec]:
    """node1..nodeN on the profile's node addresses (in the profile's order), then on further loopback
    addresses (which the profile's ``default`` serves) if more nodes are asked for than it describes."""
    addresses = list(profile.nodes)
    n = len(addresses) if count is None else count
    if n < 1:
        raise ExperimentError(f"--nodes: expected at least 1 node, got {n}")
    base = int(ipaddress.IPv4Address("127.0.0.2"))  # then on through 127.0.0.0/8 (more than 253: simulator only)
    spare = (a for i in range(2**24 - 2) if (a := str(ipaddress.IPv4Address(base + i))) not in addresses)
    while len(addresses) < n:
        addresses.append(next(spare))
    return [NodeSpec(f"node{i}", addresses[i - 1], types="0") for i in range(1, n + 1)]


GENERATED = "generated:"  # --profile generated:FAMILY: a world of scheduler_ext.sim.families, as a profile (--sim)
MAX_SIM_PRODUCTS = 100_000
MAX_SIM_SITES = 10_000
MAX_SIM_NODES = 100_000
MAX_SIM_REPEAT = 1_000


def products_for(count: int) -> tuple[dict[str, str], ...]:
    """The paper's four products, then ``product 5`` .. ``product N``: ``count`` products.

    >>> [p["name"] for p in products_for(6)][3:]
    ['雀巢中老年奶粉', 'product 5', 'product 6']
    """
    return (*PRODUCTS[:count], *({"name": f"product {i}"} for i in range(len(PRODUCTS) + 1, count + 1)))


def _load(profile: str, *, sim: bool, nodes: int | None, sites: int | None, duration: float, seed: int) -> Profile:
    """The profile named by ``--profile``: built in, a file, or generated (``generated:FAMILY``, --sim only)."""
    if not profile.startswith(GENERATED):
        if sites is not None:
            raise ExperimentError(f"--sites: only with a generated profile (--profile {GENERATED}FAMILY); the "
                                  f"sites of {profile!r} are the ones it names")
        try:
            return load_profile(profile)
        except ProfileError as exc:
            raise ExperimentError(str(exc)) from exc
    from product_crawl.experiment.sim import PROFILE_FAMILIES, generated_profile

    family = profile[len(GENERATED):]
    if family not in PROFILE_FAMILIES:
        raise ExperimentError(f"--profile: unknown generated family {family!r}; expected {GENERATED}FAMILY with "
                              f"FAMILY one of {', '.join(PROFILE_FAMILIES)}")
    if not sim:
        raise ExperimentError(f"--profile {profile}: a generated profile is for the simulator (--sim); a real run "
                              "needs a built-in profile or a file")
    if sites is not None and not 1 <= sites <= MAX_SIM_SITES:
        raise ExperimentError(f"--sites: expected 1 .. {MAX_SIM_SITES} sites, got {sites}")
    return generated_profile(family, nodes=12 if nodes is None else nodes, sites=8 if sites is None else sites,
                             duration=duration, seed=seed)


def make_options(*, profile: str = "paper", duration: float = 90.0, strategies: str = ",".join(DEFAULT_CONFIGURATIONS),
                 ablations: bool = False, seed: int = 0, out: Path | None = None, nodes: int | None = None,
                 overrides: dict[str, Any] | None = None, sample_interval: float | None = None,
                 prefix: str = EXPERIMENT_PREFIX, database: str = EXPERIMENT_DATABASE, sim: bool = False,
                 repeat: int = 1, products: int | None = None, sites: int | None = None,
                 machine_seconds: float | None = None, jobs: int = 1) -> Options:
    """Validate everything a run needs, before anything starts; raises :class:`ExperimentError` if bad.

    ``sample_interval`` defaults to 3 s, or to 1/100 of a longer simulated run (``duration / 100``);
    ``machine_seconds`` to :data:`MACHINE_SECONDS` for a real run (the simulator shares no machine)."""
    configurations = parse_configurations(strategies, ablations)
    if not MIN_DURATION <= duration <= MAX_DURATION:  # also refuses NaN
        raise ExperimentError(f"--duration: expected a number of seconds, at least {MIN_DURATION:.0f} (shorter runs "
                              f"end before the nodes have measured anything) and at most {MAX_DURATION:.0f} (a "
                              f"week), got {duration:g}")
    check_overrides(configurations, overrides or {})
    if sim and "scrapy_redis" in configurations:  # until 2026-12-06 simulated with no overrides: dynamic's run again
        raise ExperimentError("--strategies: scrapy_redis runs scrapy-redis's own spiders (no control), which the "
                              "simulator does not model; with --sim, expected configurations it drives (shared is "
                              "the shared FIFO queue, as scrapy-redis's, through this control)")
    if products is not None and (not sim or not 1 <= products <= MAX_SIM_PRODUCTS):
        raise ExperimentError(f"--products: expected 1 .. {MAX_SIM_PRODUCTS} products with --sim (a real run "
                              f"searches the paper's four), got {products}{'' if sim else ' without --sim'}")
    if sim and nodes is not None and not 1 <= nodes <= MAX_SIM_NODES:  # before a world of them is built
        raise ExperimentError(f"--nodes: expected 1 .. {MAX_SIM_NODES} simulated nodes, got {nodes}")
    if sim and not 1 <= repeat <= MAX_SIM_REPEAT:  # every run's record stays in memory until the summary
        raise ExperimentError(f"--repeat: expected 1 .. {MAX_SIM_REPEAT} seeds, got {repeat}")
    loaded = _load(profile, sim=sim, nodes=nodes, sites=sites, duration=duration, seed=seed)
    if sample_interval is None:
        sample_interval = max(3.0, duration / 100) if sim else 3.0
    site_list = profile_sites(loaded)
    if not site_list:
        raise ExperimentError(f"{loaded.source}: names no sites under nodes.<address>.sites; the experiment "
                              "crawls the sites the profile describes")
    if not sim and nodes is not None and nodes > 253:
        raise ExperimentError(f"--nodes: a real run binds each node to its own loopback address, at most 253; got "
                              f"{nodes} (the simulator takes more: --sim)")
    if repeat < 1 or (repeat > 1 and not sim):
        raise ExperimentError(f"--repeat: expected 1, or more with --sim (simulated runs are cheap), got {repeat}")
    if jobs < 1 or (jobs > 1 and not sim):
        raise ExperimentError(f"--jobs: expected 1, or more with --sim (a real run's configurations share the "
                              f"machine and its services, one at a time), got {jobs}")
    if not 0.5 <= sample_interval <= duration / 4:
        raise ExperimentError(f"sample interval: expected 0.5 .. {duration / 4:g} seconds, got {sample_interval:g}")
    if machine_seconds is not None and (sim or not 0 <= machine_seconds <= MAX_MACHINE_SECONDS):
        raise ExperimentError(f"--machine-seconds: expected 0 (the recorded figures) .. {MAX_MACHINE_SECONDS:g} "
                              f"seconds for a real run, got {machine_seconds:g}"
                              f"{' with --sim (its nodes share no machine)' if sim else ''}")
    if machine_seconds is None:
        machine_seconds = 0.0 if sim else MACHINE_SECONDS
    when = time.strftime("%Y%m%d-%H%M%S")
    return Options(profile_spec=profile, profile=loaded, duration=float(duration), configurations=configurations,
                   seed=seed, out=out or Path("var/experiment") / when, nodes=experiment_nodes(loaded, nodes),
                   sites=site_list, overrides=dict(overrides or {}), sample_interval=sample_interval, prefix=prefix,
                   database=database, sim=sim, repeat=repeat,
                   products=PRODUCTS if products is None else products_for(products),
                   machine_seconds=float(machine_seconds), jobs=jobs)


#: The Scrapy settings a configuration's nodes (and the simulated nodes) read as numbers: name -> (kind, least).
NODE_SETTINGS: dict[str, tuple[type, float]] = {
    "CONCURRENT_REQUESTS": (int, 1), "CONCURRENT_REQUESTS_PER_DOMAIN": (int, 1), "DOWNLOAD_DELAY": (float, 0.0)}


def check_overrides(configurations: Sequence[str], overrides: dict[str, Any]) -> None:
    """Every configuration's settings with ``overrides`` (``--set``) as its nodes and control would read them:
    ExperimentError naming the setting if one is unusable (a run would otherwise fail once started)."""
    from scrapy.settings import Settings

    from scheduler_ext.config import Config, check_number
    from scheduler_ext.exceptions import ConfigurationError
    from scheduler_ext.strategies import check_strategy_settings

    if "RANDOMIZE_DOWNLOAD_DELAY" in overrides:
        try:
            Settings(overrides).getbool("RANDOMIZE_DOWNLOAD_DELAY")  # as the nodes read it
        except ValueError as exc:
            raise ExperimentError(f"--set RANDOMIZE_DOWNLOAD_DELAY: expected true or false, got "
                                  f"{overrides['RANDOMIZE_DOWNLOAD_DELAY']!r}") from exc
    try:
        for name, (kind, least) in NODE_SETTINGS.items():
            if name in overrides:
                check_number(name, overrides[name], kind, low=least)
        for name in configurations:
            settings = Settings({**CLUSTER_SETTINGS, **CONFIGURATIONS[name][1], **overrides})
            Config.from_settings(settings)
            check_strategy_settings(settings)
    except ConfigurationError as exc:
        raise ExperimentError(f"--set {exc}") from exc


def virtual_tasks(sites: Sequence[str]) -> list[dict[str, Any]]:
    """The paper's products as virtual tasks on ``sites`` (node type 0, engine baidu)."""
    return [{**p, "type": 0, "sites": list(sites), "engines": ["baidu"]} for p in PRODUCTS]


def scrapy_redis_keys(prefix: str) -> dict[str, str]:
    """scrapy-redis's keys for the ``scrapy_redis`` configuration, under the experiment's prefix (so that a reset
    clears them too)."""
    return {"REDIS_START_URLS_KEY": f"{prefix}:sr:start_urls", "SCHEDULER_QUEUE_KEY": f"{prefix}:sr:requests",
            "SCHEDULER_DUPEFILTER_KEY": f"{prefix}:sr:dupefilter"}


def scrapy_redis_start_urls(base_url: str, sites: Sequence[str]) -> list[str]:
    """The first result page of every (product, site) query, as scrapy-redis start-URL entries that follow the
    next pages (the same products, sites and engine as :func:`virtual_tasks`)."""
    from product_crawl.engines.baidu import BaiduEngine

    engine = BaiduEngine(base_url)
    return [json.dumps({"url": engine.page_url(keywords_for(p["name"], p.get("brand")), site, 0),
                        "meta": {"product": p["name"], "page": 0, "follow": True}}, ensure_ascii=False)
            for p in PRODUCTS for site in sites]


def corpus_totals(profile: Profile, sites: Sequence[str], seed: int,
                  products: Sequence[dict[str, str]] = PRODUCTS) -> dict[str, dict[str, int]]:
    """What the simulated web holds for each (product, site): the engine-reported total of its query."""
    words = {p["name"]: keywords_for(p["name"], p.get("brand")) for p in products}  # segmented once per product
    return {name: {site: corpus_size(w, site, seed, profile.corpus_min, profile.corpus_max) for site in sites}
            for name, w in words.items()}


def expected_completion(profile: Profile, address: str, site: str, elapsed: float) -> float:
    """The true completion of (node, site) at ``elapsed``: the share served of the pages that are served."""
    b = profile.behaviour(address, site, elapsed)
    return b.share * max(0.0, 1.0 - b.error_rate - b.block_rate)


def suited_sites(profile: Profile, address: str, sites: Sequence[str], elapsed: float,
                 floor: float = 0.5) -> list[str]:
    """The sites on which the node at ``address`` gets at least ``floor`` of the best node's true completion
    (the paper's "sites a node suits": where it is served most of the results)."""
    best = {s: max((expected_completion(profile, a, s, elapsed) for a in profile.nodes), default=0.0)
            for s in sites}
    return [s for s in sites
            if best[s] > 0 and expected_completion(profile, address, s, elapsed) >= floor * best[s]]


# --- one configuration ---------------------------------------------------------------------------------------


class Progress:
    """One status line on stderr, rewritten in place (``\\r``) while a configuration runs."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = 0

    def update(self, text: str) -> None:
        pad = max(0, self.width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self.width = len(text)

    def done(self, text: str) -> None:
        self.update(text)
        self.stream.write("\n")
        self.stream.flush()
        self.width = 0


def _get_json(url: str, timeout: float = 5.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return dict(json.loads(response.read().decode("utf-8")))
    # The web stopped or answers garbage: the caller records nothing rather than failing the whole run.
    except (OSError, ValueError) as exc:
        logger.warning("could not read %s: %s", url, exc)
        return None


#: The key (under the prefix) and the collection (in the database) an experiment leaves where it ran: the mark that
#: they are its scratch space, which it wipes before each configuration.
SCRATCH_MARK = "experiment"


def wipe_scratch(cluster: LocalCluster, opts: Options) -> None:
    """Delete the experiment's Redis keys and drop its database, so that a configuration starts from fresh state,
    only if nothing but an experiment used them: keys under the prefix without the experiment's mark, or a database
    with collections and without it, are someone else's (a deployment given ``--prefix {pc}`` or ``--database
    product_crawl`` by mistake lost its queues, or every item it had collected); ExperimentError naming them,
    before anything is deleted. Marks both afterwards."""
    mark = f"{opts.prefix}:{SCRATCH_MARK}"
    if opts.prefix != EXPERIMENT_PREFIX and not cluster.redis.exists(mark):
        used = next(iter(cluster.redis.scan_iter(match=cluster.store.keys.everything, count=1000)), None)
        if used is not None:
            raise ExperimentError(f"--prefix {opts.prefix!r}: Redis holds keys under it that no experiment made (such "
                                  f"as {used!r}); an experiment deletes every key of its prefix before each "
                                  f"configuration: give it a prefix of its own")
    database = cluster.mongo[opts.database]
    if opts.database != EXPERIMENT_DATABASE and opts.database in cluster.mongo.list_database_names():
        collections = database.list_collection_names()
        if collections and SCRATCH_MARK not in collections:
            raise ExperimentError(f"--database {opts.database!r}: it holds collections no experiment made ("
                                  f"{', '.join(sorted(collections)[:5])}); an experiment drops its database before "
                                  f"each configuration: give it a database of its own")
    cluster.reset()
    cluster.redis.set(mark, "scrapy experiment's scratch space: wiped before each configuration")
    database[SCRATCH_MARK].insert_one({"note": "scrapy experiment's scratch space: dropped before each configuration"})


def run_configuration(name: str, opts: Options, *, redis_url: str, mongo_uri: str, label: str = "",
                      progress: Progress | None = None,
                      clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Run configuration ``name`` once from fresh state; returns its raw record (see :func:`summarize_run`)."""
    settings = {**CLUSTER_SETTINGS, **CONFIGURATIONS[name][1], **opts.overrides}
    log_dir = opts.out / "logs" / name
    cluster = LocalCluster(redis_url=redis_url, mongo_uri=mongo_uri, mongo_db=opts.database, prefix=opts.prefix,
                           log_dir=log_dir, settings=settings)
    progress = progress or Progress()
    tag = f"[{label or name}]"
    try:
        wipe_scratch(cluster, opts)
        # The web's address is fixed before the nodes start, but the web itself starts only once every node
        # heartbeats: its phase clock then starts with the run, whatever the start-up time of this configuration.
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cluster.settings["PC_ENGINE_BASE_URLS"] = {"baidu": url, "weibo": url}
        cluster.settings["SCHEDEXT_ORACLE_URL"] = url + "/_truth"
        redis_nodes = name == "scrapy_redis"
        for node in opts.nodes:
            if redis_nodes:
                cluster.start_node(node, "redis_search", DOWNLOAD_BIND_ADDRESS=node.address,
                                   **scrapy_redis_keys(opts.prefix))
            else:
                cluster.start_node(node)
        if not redis_nodes:
            # The control starts with the nodes, before the web and the run's clock: its start-up (Scrapy, jieba's
            # dictionary) is not the configuration's, and the oracle reads the web's truth at its first allocation.
            cluster.start_control()
        progress.update(f"{tag} starting {len(opts.nodes)} nodes ...")

        def started() -> bool:
            dead = [n for n in [*(n.id for n in opts.nodes), *([] if redis_nodes else ["control"])]
                    if not cluster.alive(n)]
            if dead:
                raise ExperimentError(f"{tag} {dead[0]} exited at start; see {log_dir / (dead[0] + '.log')}")
            if redis_nodes:  # scrapy-redis nodes register nowhere: their log says when they are open
                logs = [log_dir / f"{n.id}.log" for n in opts.nodes]
                return all(log.exists() and "Spider opened" in log.read_text(errors="replace") for log in logs)
            keys = cluster.store.keys
            return len(cluster.redis.hkeys(keys.nodes)) >= len(opts.nodes) and bool(cluster.redis.get(keys.leader))

        if not cluster.wait_for(started, STARTUP_TIMEOUT):
            raise ExperimentError(f"{tag} the nodes did not all heartbeat (or the control did not lead) within "
                                  f"{STARTUP_TIMEOUT:.0f} s; see the logs in {log_dir}")
        cluster.simweb = SimWebProcess(opts.profile_spec, seed=opts.seed, port=port)
        try:
            cluster.simweb.start()
        except RuntimeError as exc:  # the port was taken meanwhile, or the web failed: nothing ran yet
            raise ExperimentError(f"{tag} {exc}") from exc
        t0 = clock()
        if redis_nodes:
            cluster.redis.rpush(scrapy_redis_keys(opts.prefix)["REDIS_START_URLS_KEY"],
                                *scrapy_redis_start_urls(url, opts.sites))
        else:
            tasks: list[dict[str, Any] | str] = [*virtual_tasks(opts.sites)]
            cluster.inject(tasks)
        samples: list[dict[str, Any]] = []
        status: dict[str, Any] = {}
        next_at = 0.0
        while True:
            elapsed = clock() - t0
            if elapsed >= next_at or elapsed >= opts.duration:
                t = min(elapsed, opts.duration) if elapsed >= opts.duration else elapsed
                s, status = _sample(cluster, t)
                samples.append(s)
                progress.update(f"{tag} {min(elapsed, opts.duration):4.0f}/{opts.duration:.0f} s  items "
                                f"{s['items']}  waiting {s['waiting']}  tasks done {s['tasks_done']}/"
                                f"{s['tasks']}")
                if elapsed >= opts.duration:
                    break
                next_at += opts.sample_interval
            dead = [n for n in [*[n.id for n in opts.nodes], *([] if redis_nodes else ["control"])]
                    if not cluster.alive(n)]
            if dead:
                raise ExperimentError(f"{tag} {dead[0]} exited during the run; see {log_dir / (dead[0] + '.log')}")
            time.sleep(max(0.0, min(next_at, opts.duration) - (clock() - t0)))
        web = _get_json(url + "/_counters") or {}
        truth = _get_json(url + "/_truth") or {}
        # The crawl ends with the window. Counting items per node is a scan of the collection on nx-27017
        # (a $group it runs in Python, seconds at 100,000 items) that held up the nodes' writes past their
        # timeout when they were still running.
        cluster.stop_processes()
        by_node = cluster.items_by("node_id")
        progress.done(f"{tag} {opts.duration:.0f} s done: {samples[-1]['items']} unique items")
        return {"name": name, "settings": settings, "samples": samples, "items_by_node": by_node, "web": web,
                "truth_corpus": truth.get("corpus", []), "status": status}
    finally:
        cluster.stop()


def _sample(cluster: LocalCluster, t: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """One sample (see :func:`product_crawl.experiment.summary.summarize_run`) and the status it was read from."""
    status = cluster.status()
    pairs = {}
    for site, per_node in status["completion"].items():
        for node, c in per_node.items():
            pairs[f"{node}|{site}"] = [c["offered"], c["collected"], c["runs"], c["pages"], c["completion"],
                                       c["pace"]]
    products = status["products"]
    # The estimated count is the collection's metadata (instant); an exact count scans it, and a scan every few
    # seconds would load the shared MongoDB server with work the nodes' writes are waiting for.
    items = int(cluster.mongo[cluster.mongo_db]["items"].estimated_document_count())
    return {"t": round(t, 2), "items": items, "waiting": status["queues"]["waiting"],
            "tasks": sum(p["tasks"] for p in products.values()),
            "tasks_done": sum(p["done"] for p in products.values()),
            "pairs": pairs}, status
