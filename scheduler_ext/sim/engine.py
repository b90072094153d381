"""The discrete-event simulation of a cluster: nodes crawl subtasks, a control ticks, time is simulated.

What is simulated, and how (docs/strategies.md, "The simulator", gives the calibration):

* **Tasks.** Each :class:`TaskSpec` is one (product, site) query with ``results`` results (pages of
  ``PAGE_SIZE``). Tasks enter the waiting set in order, with their sequence number as priority, as the splitter makes
  them; the control's allocation only ever sees the window of the lowest priorities, so tasks are created lazily,
  just before they could enter that window (the result is the same as creating them all at once, without the
  memory).
* **The control** is the real one's decision step: every ``tick`` seconds, and ``wake`` seconds after the end of
  the last tick when a node reports (the leader waits on its reports between ticks: docs/control.md), the
  simulator builds the :class:`~scheduler_ext.control.Snapshot` the control would read (reports, failures, their
  tasks, the work of nodes that left once it is older than the recall age, the live nodes with their free slots,
  the window of waiting subtasks), calls :func:`scheduler_ext.control.decide` with the strategies, and applies
  the decisions' writes to its state at the tick's end: a tick takes the time :class:`ControlModel` says, reads
  at most ``batch`` reports, failures and lost subtasks, and no tick starts before the previous one ended.
  Modification, recall and allocation are therefore decided by the same code as in a real cluster; only reading
  and applying are the simulator's.
* **A node** (the real node's ``Pace``, docs/node.md) holds up to ``requests`` subtasks at once and takes the next
  subtask of its crawl queue whenever it has room: fewer than ``ready`` of its pages wait to start (``concurrency``,
  or under a ``delay`` what starts within a second: :func:`~scheduler_ext.config.ready_pages`) (at once
  after a finish or when a page starts, and as an entry reaches its crawl queue: an idle node waits on it). The
  pages of all its subtasks share its
  ``concurrency`` page slots, first taken first served, and its CPU (``page_cpu`` per page served, ``item_cpu`` per
  item stored: a page starts no sooner than the CPU has finished the pages before it), and, under a
  ``DOWNLOAD_DELAY`` (``delay``), no sooner than the delay after the node's previous page started (all of a node's
  pages go to the engine's host: one download slot, as in Scrapy). Each page waits its latency,
  then is an HTTP error, a captcha or a page that serves each of its results with probability ``share``. The first
  failed page ends the subtask (pages not yet started are dropped, as the node's middleware drops them); the time
  limit drops the pages it cuts. A subtask's ``overhead`` (take and finish round trips) delays its first page by
  half and its report by half, but holds no page slot: other subtasks' pages run meanwhile. A report's
  ``node_seconds`` is the slot time of its pages over ``concurrency``, as a real node measures it: each page from
  taking its slot (its wait for the node's CPU included, as a busy Scrapy process is late to send a request and
  to read its response) to its end or the time limit.
* **Prefetch.** A node with a fixed ``prefetch`` advertises it; else the adaptive one of the real node: it starts at
  ``ceil(ready / page_limit)``, is sized at each of the node's heartbeats (``heartbeat`` seconds apart, the
  nodes' out of step) to about two ticks of the take rate measured since the last, doubles when the node is busy
  and its queue ran dry, and stays within ``4 x requests``. (Until 2026-12-03 the simulator re-paced every node at
  every tick; on the paper profile that filled the nodes' prefetch within 0.2 s where a real node takes a second or
  more, and gave the bandit's first looks at every pair at once: dynamic / oracle 0.970 then, 0.964 now, 16 seeds.)
* **Estimates** are updated at each finish exactly as ``lua/finish.lua`` updates them
  (:class:`~scheduler_ext.sim.estimates.MemoryEstimates`).

:meth:`Simulation.run` returns the same raw record a real experiment run produces (samples of unique items and of
the per-(node, site) counters, items per node, web counters, node counters), so the experiment's summary and report
are computed from either by the same code.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import heapq
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import ready_pages
from ..control import CountingIds, Decision, Entry, HealthySites, Snapshot, Strategies, backing_off, decide
from ..keys import Keys
from ..models import Report, Subtask, Task, resume_page
from ..strategies import Allocation, Modification, NodeView, Recall
from .estimates import MemoryEstimates
from .world import PAGE_SIZE, World

#: Simulated seconds between two of the run's collections of cyclic garbage (:func:`collections_apart`).
COLLECT_EVERY = 600.0


@contextlib.contextmanager
def collections_apart() -> Iterator[Callable[[], None]]:
    """Python's cyclic garbage collector off for the block (restored after); the block calls what it is given
    (``collect``) every :data:`COLLECT_EVERY` simulated seconds, which collects the cycles made since the last
    call and freezes what survived (``gc.freeze``: the next collection does not walk it again).

    A simulation makes millions of short-lived, acyclic objects (subtasks, reports, records), freed as soon as they
    are dropped, beside a heap of millions more that lives as long as the run; the collector's automatic passes
    walked them, and they were a fifth of a 1,000-node run's CPU even with the youngest generation collected every
    100,000 allocations instead of 700 (polite 1,000-node run, 1,200 simulated s: 49.8 CPU s against 39.4 with the
    collector off, the same assignments). What they found is next to nothing: 1,595 objects in cycles in 600
    simulated seconds, against 1.8 million alive. Cycles are still collected, in one pass per ``COLLECT_EVERY``
    simulated seconds that walks only what was made since the last.
    """
    enabled = gc.isenabled()
    gc.disable()

    def collect() -> None:
        gc.collect()
        gc.freeze()

    try:
        yield collect
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class TaskSpec:
    group: str
    site: str
    results: int  # what the engine reports: the task has ceil(results / PAGE_SIZE) pages
    type: int = 0


@dataclass
class SimNode:
    """A simulated crawl node: ``joins`` / ``leaves`` (seconds) model nodes joining and leaving the cluster."""

    id: str
    types: tuple[int, ...] = (0,)
    prefetch: int | None = None  # None: adaptive, as the real node's (the module doc)
    joins: float = 0.0
    leaves: float = math.inf
    address: str | None = None


@dataclass(frozen=True)
class NodeModel:
    """The costs of a node's machinery (calibrated against real runs on this machine: docs/strategies.md)."""

    concurrency: int = 8  # a node's pages in flight at once, all its subtasks together (CONCURRENT_REQUESTS_PER_DOMAIN)
    requests: int = 16  # subtasks a node holds at once (CONCURRENT_REQUESTS); sizes the adaptive prefetch too
    overhead: float = 0.05  # seconds per subtask: take, first request, finish script, report (overlapped)
    # node seconds per page served: its parse, and its share of a 2-core machine that it shares with the other nodes,
    # the web, MongoDB and the control (fitted to real runs: docs/strategies.md, "The simulator")
    page_cpu: float = 0.006
    item_cpu: float = 0.0005  # node seconds per item stored
    refill_interval: float = 0.5  # seconds between a busy node's growths of its adaptive prefetch
    # seconds between the starts of two of a node's pages (DOWNLOAD_DELAY: every page of a node goes to the engine's
    # host, one download slot), each wait drawn in [0.5, 1.5] x delay as Scrapy does (RANDOMIZE_DOWNLOAD_DELAY)
    delay: float = 0.0
    randomize_delay: bool = True

    @property
    def ready(self) -> int:
        """Pages the node keeps waiting ready to download (the real node's ``Pace.ready``:
        :func:`~scheduler_ext.config.ready_pages`)."""
        return ready_pages(self.concurrency, self.delay)

    def with_settings(self, settings: Any) -> NodeModel:
        """This model under a configuration's Scrapy settings (a ``BaseSettings``), read as a real node reads them:
        ``concurrency`` is ``CONCURRENT_REQUESTS_PER_DOMAIN`` capped by ``CONCURRENT_REQUESTS`` (the node's
        ``Pace.ready``), ``requests`` is ``CONCURRENT_REQUESTS``, ``delay`` and ``randomize_delay`` are
        ``DOWNLOAD_DELAY`` and ``RANDOMIZE_DOWNLOAD_DELAY``. The machinery's costs stay the model's.

        >>> from scrapy.settings import Settings
        >>> m = NodeModel().with_settings(Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 2, "DOWNLOAD_DELAY": 1.5}))
        >>> m.concurrency, m.requests, m.delay, m.randomize_delay, m.page_cpu == NodeModel().page_cpu
        (2, 16, 1.5, True, True)
        """
        requests = max(1, settings.getint("CONCURRENT_REQUESTS"))
        return dataclasses.replace(
            self, concurrency=max(1, min(requests, settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"))),
            requests=requests, delay=max(0.0, settings.getfloat("DOWNLOAD_DELAY")),
            randomize_delay=settings.getbool("RANDOMIZE_DOWNLOAD_DELAY"))


@dataclass(frozen=True)
class ControlModel:
    """How long the control's tick takes, in seconds: ``base + per_node x live nodes + per_input x (reports,
    failures and lost subtasks read) + per_entry x waiting subtasks offered to allocation + per_decision x
    decisions written``. The simulator decides at the tick's start and applies the decisions at its end; no other
    tick starts meanwhile (the real control skips a tick while one runs), and a report wakes the next tick
    ``wake`` seconds after the end at the soonest. A small cluster's ticks take a millisecond or two, so this
    changes nothing there; at a thousand nodes they take a good part of a second, and the real control ticks
    that much less often than ten times a second. Calibrated on this machine (docs/strategies.md, "The
    simulator"): the decisions from the simulator's own :func:`~scheduler_ext.control.decide` at 12 and 1,000
    nodes, the reads and writes from ``benchmarks/bench_control.py``. :data:`FREE_CONTROL` is a control whose
    ticks take no time (the simulator's former model)."""

    base: float = 0.002
    per_node: float = 12e-6
    per_input: float = 150e-6
    per_entry: float = 80e-6
    per_decision: float = 50e-6

    def cost(self, nodes: int, inputs: int, entries: int, decisions: int) -> float:
        """The seconds of one tick.

        >>> round(ControlModel().cost(nodes=1000, inputs=300, entries=4000, decisions=600), 3)
        0.409
        """
        return (self.base + self.per_node * nodes + self.per_input * inputs + self.per_entry * entries
                + self.per_decision * decisions)


#: A control whose ticks take no time: decisions applied the moment they are made (the simulator's former model).
FREE_CONTROL = ControlModel(0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass
class _Run:
    st: Subtask
    node: str
    started: float


@dataclass
class _TaskState:
    task: Task
    total_pages: int
    results: int
    # page -> the most results one run collected on it (the unique items it gave): a byte a page, made at the task's
    # first report (a dict of them held gigabytes over a simulated day at 1,000 nodes)
    collected_pages: bytearray | None = None


class Simulation:
    """One simulated run of one configuration. Build, then :meth:`run`."""

    def __init__(self, world: World, nodes: Sequence[SimNode], tasks: Iterable[TaskSpec], *,
                 allocation: Allocation, modification: Modification, recall: Recall, duration: float,
                 tick: float = 0.5, wake: float = 0.1, page_limit: int = 5, time_limit: float = 30.0,
                 alpha: float = 0.3, recall_age: float | None = None, model: NodeModel | None = None,
                 control: ControlModel | None = None, batch: int = 500, sample_interval: float = 3.0, seed: int = 0,
                 pair_samples: bool = True, on_sample: Callable[[dict[str, Any]], None] | None = None,
                 heartbeat: float = 2.0, lanes: int = 2, idle_lanes: int = 8) -> None:
        self.world, self.nodes = world, {n.id: n for n in nodes}
        self.allocation, self.modification, self.recall = allocation, modification, recall
        self.duration, self.tick, self.wake = duration, tick, wake
        self._ticked = -math.inf  # when the last tick ended (its decisions applied)
        self.control = control or ControlModel()
        self._held = 0  # subtasks of the last window waiting out their retry delay (control.backing_off)
        self._behind = False  # the last tick read a full batch of reports or failures: the next starts at once
        self.batch = batch  # reports, failures and lost subtasks read a tick at most (SCHEDEXT_TICK_BATCH)
        # the decisions of the tick in progress and the window it took, applied at its end
        self._pending: tuple[list[Decision], list[tuple[float, int, int, Subtask]]] = ([], [])
        self._woken = False  # a tick woken by a report is due
        self.page_limit, self.time_limit = page_limit, time_limit
        self.recall_age = recall.threshold if recall_age is None else recall_age
        self.strategies = Strategies(allocation, modification, recall, page_limit=page_limit, time_limit=time_limit,
                                     recall_age=self.recall_age, lanes=lanes, idle_lanes=idle_lanes)
        self.keys = Keys("{sim}")
        self._crawl_key, self._counts_key = self.keys.crawl(""), self.keys.node_counters("")
        self._write_keys = (self.keys.subtasks, self.keys.tasks, self.keys.waiting)
        self.ids = CountingIds()
        self.model = model or NodeModel()
        self.sample_interval, self.pair_samples, self.on_sample = sample_interval, pair_samples, on_sample
        self.rng = random.Random(seed)
        self.estimates = MemoryEstimates(alpha, fail_cost=1.5 * tick)  # a recall: 1.5 ticks on average
        self._source: Iterator[TaskSpec] = iter(tasks)
        self._source_left = True
        self._seq = 0
        self._events: list[tuple[float, int, str, Any]] = []
        self.now = 0.0
        # scheduling state (the Redis keys of docs/redis-keys.md, in memory)
        self.tasks: dict[str, _TaskState] = {}
        self._open_pairs: dict[tuple[str, str], int] = {}  # (product, site) -> its open tasks
        # ``waiting`` as a heap of (priority, id, entry number, subtask); an entry is current while ``subtasks[id]``
        # is its subtask (allocated, or requeued as a new record, it is skipped when it comes up). The entry number
        # orders a requeued subtask's entries, so that two never compare their subtasks.
        self.waiting: list[tuple[float, int, int, Subtask]] = []
        self.subtasks: dict[str, Subtask] = {}  # waiting subtask id -> its record
        self.queues: dict[str, list[Subtask]] = {n: [] for n in self.nodes}
        self.running: dict[str, dict[str, _Run]] = {n: {} for n in self.nodes}
        self.held = dict.fromkeys(self.nodes, 0)  # subtasks each node held at its last heartbeat
        m = self.model
        self.slots: dict[str, list[float]] = {n: [0.0] * max(1, m.concurrency) for n in self.nodes}
        self.cpu_free: dict[str, float] = dict.fromkeys(self.nodes, 0.0)
        self.next_start: dict[str, float] = dict.fromkeys(self.nodes, 0.0)  # a node's next page, by its delay
        self.starts: dict[str, list[float]] = {n: [] for n in self.nodes}  # start times of pages not yet started
        self.ready = m.ready  # pages a node keeps waiting to start
        self.prefetch_min = math.ceil(self.ready / max(1, page_limit))
        self.prefetch_max = max(self.prefetch_min, 4 * m.requests)
        self.prefetch = {n.id: self.prefetch_min if n.prefetch is None else n.prefetch for n in nodes}
        self._takes: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self._fed: dict[str, int] = dict.fromkeys(self.nodes, 0)  # takes since the node's prefetch last changed
        # A real node re-paces its prefetch at each of its heartbeats (SCHEDEXT_HEARTBEAT_INTERVAL), which are not
        # in step with the control's ticks nor with each other's: node i's are offset by i / nodes of an interval.
        self.heartbeat = heartbeat
        self._paced_at: dict[str, float] = {nid: i / len(self.nodes) * heartbeat - heartbeat
                                            for i, nid in enumerate(self.nodes)}
        self._grown_at: dict[str, float] = dict.fromkeys(self.nodes, -math.inf)
        self.reports: list[Report] = []
        self.failures: list[Report] = []
        self.lost: list[tuple[float, Subtask]] = []  # (when the control notices, subtask) of nodes that left
        self.polling: set[str] = set()
        self._views: dict[str, NodeView] = {}
        self._pending_pages: dict[str, dict[int, int]] = {}  # subtask id -> page -> results collected
        # measurements
        self.unique = 0
        self.items_by_node: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.pairs: dict[str, list[float]] = {}  # "node|site" -> [offered, collected, runs, pages]
        self.web: dict[str, dict[str, int]] = {}
        self.counts: dict[str, dict[str, int]] = {n: {} for n in self.nodes}
        self.samples: list[dict[str, Any]] = []
        self.tasks_made = 0
        self.busy: dict[str, float] = {}  # node -> subtask-seconds held (subtasks overlap: may exceed the run)
        self.tasks_done = 0
        self.allocated = 0
        self.first_use: dict[tuple[str, str], list[float]] = {}  # (node, site) -> start times of its runs

    # --- events ---------------------------------------------------------------------------------------------------
    def _at(self, t: float, kind: str, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload))

    def _id(self) -> str:
        return self.ids.take(1)[0]

    def _count(self, node: str, name: str, n: int = 1) -> None:
        c = self.counts.setdefault(node, {})
        c[name] = c.get(name, 0) + n

    def live(self, nid: str) -> bool:
        n = self.nodes[nid]
        return n.joins <= self.now < n.leaves

    def run(self) -> dict[str, Any]:
        """Simulate ``duration`` seconds; the raw record (see the module doc)."""
        with collections_apart() as collect:
            return self._run(collect)

    def _run(self, collect: Callable[[], None]) -> dict[str, Any]:
        collected = 0.0  # the simulated time of the last collection (collections_apart)
        self._at(0.0, "tick")
        self._at(0.0, "sample")
        for n in self.nodes.values():
            if n.leaves < self.duration:
                self._at(n.leaves, "leave", n.id)
        while self._events:
            t, _, kind, payload = heapq.heappop(self._events)
            if t > self.duration:
                break
            self.now = t
            if kind == "finish":
                self._finish(payload)
            elif kind == "tick":
                self._tick()
                self._at(t + self.tick, "tick")
                if t - collected >= COLLECT_EVERY:
                    collect()
                    collected = t
            elif kind == "wake":
                if self.now < self._ticked:  # a tick started meanwhile: wake after it
                    self._at(self._ticked + self.wake, "wake")
                    continue
                self._woken = False
                self._tick()
            elif kind == "applied":
                self._applied()
            elif kind == "poll":
                self.polling.discard(payload)
                self._take(payload)
            elif kind == "sample":
                self._sample()
                if t < self.duration:
                    self._at(min(t + self.sample_interval, self.duration), "sample")
            elif kind == "leave":
                self._leave(payload)
        self._applied()  # a tick the run's end interrupted: its decisions were made (nothing is left half-done)
        if not self.samples or self.samples[-1]["t"] < self.duration:
            self.now = self.duration
            self._sample()
        return self.record()

    # --- tasks ------------------------------------------------------------------------------------------------------
    def _fill(self, want: int) -> None:
        """Make tasks from the source until ``want`` subtasks wait (or the source is empty)."""
        while self._source_left and len(self.subtasks) < want:
            spec = next(self._source, None)
            if spec is None:
                self._source_left = False
                return
            tid = self._id()
            task = Task(id=tid, site=spec.site, group=spec.group, type=spec.type, priority=float(self.tasks_made),
                        next_page=self.page_limit, page_limit=self.page_limit, time_limit=self.time_limit)
            self.tasks_made += 1
            pages = max(1, math.ceil(spec.results / PAGE_SIZE))
            self.tasks[tid] = _TaskState(task, pages, spec.results)
            self._open_pairs[(spec.group, spec.site)] = self._open_pairs.get((spec.group, spec.site), 0) + 1
            self._wait(Subtask(id=self._id(), task=tid, site=spec.site, group=spec.group, type=spec.type,
                               priority=task.priority, first_page=0, page_limit=self.page_limit,
                               time_limit=self.time_limit, since=self.now))

    def _wait(self, st: Subtask) -> None:
        self.subtasks[st.id] = st
        self._seq += 1
        heapq.heappush(self.waiting, (st.priority, int(st.id), self._seq, st))

    # --- the control ----------------------------------------------------------------------------------------------
    def _tick(self) -> None:
        """One control tick: the snapshot the control would read, its own :func:`decide`, the writes applied at the
        tick's end (:class:`ControlModel`). Skipped while the previous tick runs, as the real control skips it."""
        if self.now < self._ticked:
            return
        if self._pending[0] or self._pending[1]:  # the last tick ended now too: its writes land before this reads
            self._applied()
        self._adapt_prefetch()
        nodes = self.live_nodes()
        total_free = sum(n.free for n in nodes)
        if self._nothing_to_decide(total_free):
            self._end_tick(self.control.cost(len(nodes), 0, 0, 0), [], [])
            return
        size = self.strategies.window(total_free) + self._held if total_free else 0
        self._fill(size)
        batch = self.batch
        reports, self.reports = self.reports[:batch], self.reports[batch:]
        failures, self.failures = self.failures[:batch], self.failures[batch:]
        stale: list[tuple[str, str | None]] = []
        stale_tasks: set[str] = set()
        while self.lost and self.lost[0][0] <= self.now and len(stale) < batch:
            _, st = self.lost.pop(0)
            stale.append((st.id, st.to_json()))
            stale_tasks.add(st.task)
        self._behind = len(reports) >= batch or len(failures) >= batch  # as the control: TickRead.more
        window = self._window(size)
        # as the control: read as many more ids next tick as this window holds subtasks waiting out a retry delay
        healthy = HealthySites(self.estimates, self.now, self.strategies.recall_age)
        self._held = min(self.batch, sum(backing_off(self.strategies.recall, e[3], self.now, healthy)
                                         for e in window))
        snap = self._snapshot(reports, failures, stale, stale_tasks, nodes, [entry[3] for entry in window])
        self.estimates.read()
        decisions = list(decide(snap, self.strategies, self.now))
        inputs = len(reports) + len(failures) + len(stale)
        self._end_tick(self.control.cost(len(nodes), inputs, len(window), len(decisions)), decisions, window)

    def _end_tick(self, cost: float, decisions: list[Decision], window: list[tuple[float, int, int, Subtask]]) -> None:
        self._ticked = self.now + cost
        self._pending = (decisions, window)
        if cost > 0:
            self._at(self._ticked, "applied")
        else:
            self._applied()

    def _applied(self) -> None:
        """The end of a tick: its decisions' writes applied; what allocation left of the window waits on."""
        (decisions, window), self._pending = self._pending, ([], [])
        for decision in decisions:
            self._apply(decision)
        for entry in window:
            if self.subtasks.get(entry[3].id) is entry[3]:
                heapq.heappush(self.waiting, entry)
        if self._behind:  # the tick read a full batch: the control ticks again at once (ControlExtension._ticked)
            self._behind = False
            self._at(self.now, "wake")
        elif self.reports:  # the leader, waiting on its reports, finds them there at once
            self._wake()

    def _snapshot(self, reports: list[Report], failures: list[Report], stale: list[tuple[str, str | None]],
                  stale_tasks: set[str], nodes: list[NodeView], window: list[Subtask]) -> Snapshot:
        """What the control would read, on the object path (Snapshot.objects): reports, task records (of the
        reports and of the stale entries, ``stale_tasks``) and waiting subtasks go in as the objects the control
        would decode from Redis, and the records of the decisions' writes come back as objects. A waiting
        subtask's "record" is its id, under which ``parsed`` holds it."""
        k = self.keys
        return Snapshot(
            keys=k, now=self.now, estimates=self.estimates, ids=self.ids,
            reports=[Entry(k.sleeping, "", 0, report=r) for r in reports],
            failures=[Entry(k.failed, "", 0, report=r) for r in failures],
            tasks={tid: state.task if (state := self.tasks.get(tid)) else None
                   for tid in {r.subtask.task for r in (*reports, *failures)} | stale_tasks},
            stale=stale, nodes=nodes, waiting=[(st.id, st.id) for st in window], parsed={st.id: st for st in window},
            objects=True)

    def _nothing_to_decide(self, total_free: int) -> bool:
        """True if :func:`decide` would read this tick and decide nothing: no free slot (nothing is allocated
        without one), no report, no failure, no lost work due."""
        return not total_free and not self.reports and not self.failures \
            and not (self.lost and self.lost[0][0] <= self.now)

    def _window(self, size: int) -> list[tuple[float, int, int, Subtask]]:
        """The first ``size`` waiting subtasks, taken off the heap (the caller puts back those still waiting):
        a tick costs the window, not the waiting set."""
        out: list[tuple[float, int, int, Subtask]] = []
        heap, current = self.waiting, self.subtasks
        while heap and len(out) < size:
            entry = heapq.heappop(heap)
            if current.get(entry[3].id) is entry[3]:
                out.append(entry)
        return out

    def _apply(self, decision: Decision) -> None:
        """Apply one decision's writes to the simulated state (its guards hold: nothing runs between the steps).
        On the object path the records in the writes are the Subtask and Task objects themselves."""
        k_subtasks, k_tasks, k_waiting = self._write_keys
        records: dict[str, Subtask] = {}
        for w in decision.writes:
            op, key = w[0], w[1]
            if op == "hset" and key == k_subtasks:
                records[w[2]] = w[3]
            elif op == "hset" and key == k_tasks:
                task: Task = w[3]
                state = self.tasks.get(task.id)
                if state is not None:
                    state.task = task
                    if task.done:
                        self.tasks_done += 1
                        # nothing refers to it any more, nor to its product's figures on the site once no other
                        # task of the pair is open: memory stays bounded by the open tasks at scale
                        del self.tasks[task.id]
                        pair = (task.group, task.site)
                        self._open_pairs[pair] -= 1
                        if not self._open_pairs[pair]:
                            del self._open_pairs[pair]
                            self.estimates.forget_group(*pair)
            elif op == "zadd" and key == k_waiting:
                self._wait(records[w[3]])
            elif op == "lpush" and key.startswith(self._crawl_key):
                self._queue(key[len(self._crawl_key):], w[2])
            elif op == "hincrby" and key.startswith(self._counts_key):
                self._count(key[len(self._counts_key):], w[2], int(w[3]))
            elif op == "hdel" and key == k_subtasks:  # dead-lettered
                self.subtasks.pop(w[2], None)
        if decision.kind == "allocate":
            self.allocated += 1
            self.subtasks.pop(decision.subject, None)

    def live_nodes(self) -> list[NodeView]:
        """The live nodes as the control reads them; a node's view is made again only when its free slots or its
        queue changed (allocation reads the views, never changes them)."""
        out, views, now = [], self._views, self.now
        for n in self.nodes.values():
            if not n.joins <= now < n.leaves:
                continue
            queued = len(self.queues[n.id])
            free = max(0, self.prefetch[n.id] - queued)
            view = views.get(n.id)
            held = self.held[n.id]
            if view is None or view.free != free or view.queued != queued or view.held != held:
                view = views[n.id] = NodeView(id=n.id, types=list(n.types), address=n.address, free=free,
                                              queued=queued, held=held)
            out.append(view)
        return out

    def _adapt_prefetch(self) -> None:
        """The adaptive prefetch (``scheduler.SubtaskScheduler._adapt_prefetch``): about two ticks of takes,
        measured over the node's last heartbeat interval, at each of its heartbeats (:attr:`heartbeat`)."""
        for n in self.nodes.values():
            elapsed = self.now - self._paced_at[n.id]
            if elapsed < self.heartbeat or elapsed <= 0:
                continue
            self._paced_at[n.id] = self.now
            self.held[n.id] = len(self.running[n.id])  # what its heartbeat tells the control
            if n.prefetch is None:
                rate = self._takes[n.id] / min(elapsed, self.now - n.joins) if self.now > n.joins else 0.0
                self.prefetch[n.id] = min(self.prefetch_max,
                                          max(self.prefetch_min, math.ceil(2 * rate * self.tick) + 1))
            self._takes[n.id] = self._fed[n.id] = 0

    def _queue(self, nid: str, st: Subtask) -> None:
        self.queues[nid].append(st)
        self._poll(nid, self.now)  # a node with room waits on its crawl queue and takes the entry as it arrives

    def _poll(self, nid: str, at: float) -> None:
        if nid not in self.polling:
            self.polling.add(nid)
            self._at(at, "poll", nid)

    # --- the nodes --------------------------------------------------------------------------------------------------
    def _waiting_pages(self, nid: str) -> list[float]:
        """Start times of the node's pages not started yet (sorted)."""
        starts = self.starts[nid]
        del starts[:bisect.bisect_right(starts, self.now)]
        return starts

    def _take(self, nid: str) -> None:
        """Take subtasks while the node has room (fewer than ``requests`` held, fewer than ``ready`` pages
        waiting to start), as the real node does."""
        if not self.live(nid):
            return
        running, queue, m = self.running[nid], self.queues[nid], self.model
        while queue and len(running) < m.requests and len(self._waiting_pages(nid)) < self.ready:
            st = queue.pop(0)
            running[st.id] = run = _Run(st, nid, self.now)
            self._takes[nid] += 1
            self._fed[nid] += 1
            if self.pair_samples:
                self.first_use.setdefault((nid, st.site), []).append(self.now)
            report, ended = self._crawl(run)
            self._at(ended, "finish", (run, report))
        if queue and len(running) < m.requests:
            # Held back by pages waiting: look again when so many have started that fewer than ``ready`` wait (the
            # start times only ever grow by this node's own takes, which look again themselves).
            starts = self.starts[nid]
            self._poll(nid, starts[len(starts) - self.ready])
        elif (not queue and running and self.nodes[nid].prefetch is None and self.prefetch[nid] < self.prefetch_max
              and self._fed[nid] >= self.prefetch[nid] and self.now - self._grown_at[nid] >= m.refill_interval):
            # busy, starved and given all it asked for: ask for more
            self.prefetch[nid] = min(self.prefetch_max, 2 * self.prefetch[nid])
            self._grown_at[nid], self._fed[nid] = self.now, 0

    def _crawl(self, run: _Run) -> tuple[Report, float]:
        """Crawl ``run``'s pages now; the report and the time the node finishes it."""
        st, m, rng = run.st, self.model, self.rng
        state = self.tasks.get(st.task)
        total_pages = state.total_pages if state else st.first_page + st.page_limit
        results = state.results if state else total_pages * PAGE_SIZE
        b = self.world.behaviour(run.node, st.site, run.started)
        t0 = run.started + m.overhead / 2
        deadline = run.started + st.time_limit
        slots, starts = self.slots[run.node], self.starts[run.node]
        failed_at = math.inf
        done: dict[int, int] = {}
        offered = collected = errors = blocked = requests = cut = 0
        failed_page: int | None = None
        held = 0.0  # page-slot seconds of the run's pages
        timed_out = False
        last_end = t0
        reason = ""
        for page in range(st.first_page, min(st.first_page + st.page_limit, total_pages)):
            free = heapq.heappop(slots)
            taken = max(free, t0, self.next_start[run.node])  # the page has its slot: it waits for the CPU in it
            start = max(taken, self.cpu_free[run.node])
            if start >= failed_at:  # the subtask already failed: pages not started are dropped
                heapq.heappush(slots, free)
                break
            if start >= deadline:
                timed_out = True
                heapq.heappush(slots, free)
                break
            if m.delay > 0:
                self.next_start[run.node] = start + m.delay * (rng.uniform(0.5, 1.5) if m.randomize_delay else 1.0)
            end = start + max(0.0, b.latency + (rng.uniform(-b.spread, b.spread) if b.spread else 0.0))
            heapq.heappush(slots, end)
            held += min(end, deadline) - taken
            if start > self.now:
                bisect.insort(starts, start)
            if end > deadline:
                timed_out = True
                cut += 1
                continue
            requests += 1
            last_end = max(last_end, end)
            draw = rng.random()
            if draw < b.error_rate + b.block_rate:
                if draw < b.error_rate:
                    errors += 1
                    why = "HTTP 503"
                else:
                    blocked += 1
                    why = "blocked: a verification page"
                if end < failed_at:
                    failed_at, failed_page, reason = end, page, why
                continue
            shown = min(PAGE_SIZE, results - page * PAGE_SIZE)
            got = _binomial(rng, shown, b.share)
            done[page] = got
            self.cpu_free[run.node] = start + m.page_cpu + got * m.item_cpu
            offered += shown
            collected += got
        ended = last_end + m.overhead / 2
        if failed_page is not None:
            ended = min(ended, failed_at + m.overhead / 2)
        ended = min(ended, deadline + m.overhead / 2)
        stats = self.web.setdefault(run.node, {"requests": 0, "error": 0, "blocked": 0})
        stats["requests"] += requests
        stats["error"] += errors
        stats["blocked"] += blocked
        rng_pages = range(st.first_page, st.first_page + st.page_limit)
        next_page = next((p for p in rng_pages if p not in done), st.first_page + st.page_limit)
        exhausted = (total_pages - 1) in done
        if failed_page is not None:
            outcome = "failed"
        elif exhausted or next_page >= st.first_page + st.page_limit:
            outcome = "done"
        else:
            outcome = "timeout" if timed_out or next_page < total_pages else "done"
        report = Report(subtask=st, node=run.node, outcome=outcome, reason=reason, reported=results,
                        offered=offered, collected=collected, pages=len(done), next_page=next_page,
                        exhausted=exhausted, total_pages=total_pages, started=run.started, ended=ended,
                        attempted=requests + cut, blocked=blocked, failed=errors,
                        resume_page=resume_page(st.first_page, st.page_limit, done),
                        node_seconds=held / self.ready)
        self._pending_pages[st.id] = done
        return report, ended

    def _finish(self, payload: tuple[_Run, Report]) -> None:
        run, report = payload
        nid, st = run.node, run.st
        if self.running[nid].get(st.id) is not run:
            return
        del self.running[nid][st.id]
        self.busy[nid] = self.busy.get(nid, 0.0) + self.now - run.started
        done = self._pending_pages.pop(st.id, {})
        if not self.live(nid):
            return
        state = self.tasks.get(st.task)
        new = 0
        if state is not None:
            best = state.collected_pages
            if best is None:
                best = state.collected_pages = bytearray(state.total_pages)
            for page, got in done.items():
                old = best[page]
                if got > old:
                    new += got - old
                    best[page] = got
        self.unique += new
        self.items_by_node[nid] = self.items_by_node.get(nid, 0) + new
        pair = self.pairs.setdefault(f"{nid}|{st.site}", [0, 0, 0, 0])
        pair[0] += report.offered
        pair[1] += report.collected
        pair[2] += 1
        pair[3] += report.pages
        self.estimates.finish(site=st.site, group=st.group, node=nid, offered=report.offered,
                              collected=report.collected, pages=report.pages, seconds=report.seconds, ok=report.ok,
                              now=self.now, attempted=report.charged, blocked=report.blocked,
                              node_seconds=report.node_seconds)
        (self.reports if report.ok else self.failures).append(report)
        if report.ok:
            self._wake()
        self._take(nid)

    def _wake(self) -> None:
        """A report waits: the leader, waiting on its reports between ticks, ticks ``wake`` seconds after the
        last tick at the soonest."""
        if self.wake > 0 and not self._woken:
            self._woken = True
            self._at(max(self.now, self._ticked + self.wake), "wake")

    def _leave(self, nid: str) -> None:
        notice = self.now + self.recall_age
        for run in self.running[nid].values():
            self._pending_pages.pop(run.st.id, None)
            self.lost.append((notice, run.st))
        self.running[nid] = {}
        for st in self.queues[nid]:
            self.lost.append((notice, st))
        self.queues[nid] = []
        self.lost.sort(key=lambda x: x[0])

    # --- measurements -----------------------------------------------------------------------------------------------
    def _sample(self) -> None:
        est = self.estimates.sites
        pairs = {}
        if self.pair_samples:
            for key, (o, c, r, p) in self.pairs.items():
                nid, site = key.split("|", 1)
                e, sums = est.get(site, {}).get(nid), self.estimates.site_sums(site).get(nid)
                pairs[key] = [int(o), int(c), int(r), int(p), None if e is None else e.c,
                              None if sums is None else sums.pace]
        s = {"t": round(min(self.now, self.duration), 2), "items": self.unique, "waiting": len(self.subtasks),
             "tasks": self.tasks_made, "tasks_done": self.tasks_done,
             "pairs": pairs}
        self.samples.append(s)
        if self.on_sample is not None:
            self.on_sample(s)

    def record(self) -> dict[str, Any]:
        return {"samples": self.samples, "items_by_node": dict(self.items_by_node),
                "web": {"by_address": {(self.nodes[n].address or n): v for n, v in self.web.items()}},
                "status": {"nodes": [{"id": n, "counts": c} for n, c in self.counts.items()]},
                "allocated": self.allocated, "busy": {n: round(b, 2) for n, b in self.busy.items()},
                "first_use": {f"{n}|{s}": v for (n, s), v in self.first_use.items()}}


_CDFS: dict[tuple[int, float], list[float]] = {}


def _binomial(rng: random.Random, n: int, p: float) -> int:
    """A Binomial(n, p) draw by inversion: one uniform, the distribution function tabled once per (n, p) (the
    worlds have a few thousand distinct shares; pages have ``PAGE_SIZE`` results but the last)."""
    if n <= 0 or p <= 0:
        return 0
    if p >= 1:
        return n
    cdf = _CDFS.get((n, p))
    if cdf is None:
        if len(_CDFS) > 100_000:
            _CDFS.clear()
        cdf, total = [], 0.0
        for k in range(n):
            total += math.comb(n, k) * p ** k * (1 - p) ** (n - k)
            cdf.append(total)
        _CDFS[(n, p)] = cdf
    return bisect.bisect_right(cdf, rng.random())
