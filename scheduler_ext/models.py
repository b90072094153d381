"""What crosses Redis: subtasks, tasks and reports as versioned JSON, validated on the way in.

Nothing read from Redis is ever unpickled or evaluated: a payload is JSON or it is refused with a reason.
"""

from __future__ import annotations

import json
import math
from collections.abc import Container
from dataclasses import dataclass, field, replace
from typing import Any

from . import SCHEMA_VERSION
from .exceptions import InvalidInput


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _fields(obj: Any) -> dict[str, Any]:
    """A record's fields with the schema version, shallow (``dataclasses.asdict`` deep-copies: 5x slower, and
    the values are JSON already). The records are plain dataclasses: their ``__dict__`` is their fields."""
    return {"v": SCHEMA_VERSION, **vars(obj)}


def loads_object(raw: str | bytes, what: str) -> dict[str, Any]:
    """Decode ``raw`` as a JSON object of our schema version, or raise InvalidInput saying why."""
    try:
        # bytes must decode; a str read with surrogateescape (scheduler_ext.store) must encode back to UTF-8.
        raw = raw.decode("utf-8") if isinstance(raw, bytes) else raw.encode("utf-8").decode("utf-8")
    except UnicodeError as exc:
        raise InvalidInput(f"{what}: not UTF-8 JSON (a pickle or other binary payload?)") from exc
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{what}: not JSON ({exc.msg} at character {exc.pos})") from exc
    except RecursionError as exc:
        raise InvalidInput(f"{what}: JSON nested too deeply") from exc
    if not isinstance(obj, dict):
        raise InvalidInput(f"{what}: expected a JSON object, got {type(obj).__name__}")
    if obj.get("v", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise InvalidInput(f"{what}: schema version {obj.get('v')!r} is not the supported {SCHEMA_VERSION}")
    return obj


def _require(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str, *,
             optional: bool = False, check: Any = None, expected: str = "") -> Any:
    value = obj.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool or (check and not check(value)):
        raise InvalidInput(f"{what}: field {name!r}: expected {expected or getattr(kind, '__name__', kind)}, "
                           f"got {value!r}")
    return value


@dataclass
class Subtask:
    """A slice ``[first_page, first_page + page_limit)`` of one task's result pages, with a time limit.

    ``group`` is what the efficiency estimates are kept per (the product), ``site`` what completion is kept per;
    ``payload`` is opaque to scheduler_ext and read by the project's spider.
    """

    id: str
    task: str
    site: str
    first_page: int
    page_limit: int
    time_limit: float
    group: str = ""
    type: int = 0
    priority: float = 0.0
    attempt: int = 0  # recalls (since it last moved on, with SCHEDEXT_RECALL_RESET: a failed run that crawled pages)
    avoid: list[str] = field(default_factory=list)
    prev_node: str | None = None
    node: str | None = None
    since: float = 0.0  # Redis time it entered the waiting queue
    payload: dict[str, Any] = field(default_factory=dict)
    # Pages after the slice that the control took off it when an allocation gave the node only its first pages
    # (:meth:`capped`; after a one-page look they wait at once as a subtask of their own instead, see the control):
    # the report gives them back to the task, a recall puts them back on the subtask.
    rest: int = 0

    def to_json(self) -> str:
        return _dumps(_fields(self))

    @classmethod
    def from_dict(cls, obj: dict[str, Any], what: str = "subtask") -> Subtask:
        nonneg = lambda v: v >= 0  # noqa: E731
        return cls(
            id=_require(obj, "id", str, what, check=bool, expected="a non-empty string"),
            task=str(_require(obj, "task", (str, int), what, expected="a task id")),
            site=_require(obj, "site", str, what, check=bool, expected="a non-empty string"),
            first_page=_require(obj, "first_page", int, what, check=nonneg, expected="an integer >= 0"),
            page_limit=_require(obj, "page_limit", int, what, check=lambda v: v >= 1, expected="an integer >= 1"),
            # Finite: JSON as Python and Redis's cjson read it admits 1e999 (infinity), which the take script's
            # lease JSON cannot hold (cjson refuses to encode it); NaN fails every comparison.
            time_limit=float(_require(obj, "time_limit", (int, float), what, check=lambda v: 0 < v < math.inf,
                                      expected="a finite number of seconds > 0")),
            group=_require(obj, "group", str, what, optional=True) or "",
            type=_require(obj, "type", int, what, optional=True, check=nonneg, expected="a node type >= 0") or 0,
            # The score in `waiting`: ZADD refuses NaN, and a commit that raises stops every decision after it.
            priority=float(_require(obj, "priority", (int, float), what, optional=True, check=math.isfinite,
                                    expected="a finite number") or 0.0),
            attempt=_require(obj, "attempt", int, what, optional=True, check=nonneg) or 0,
            avoid=list(_require(obj, "avoid", list, what, optional=True) or []),
            prev_node=_require(obj, "prev_node", str, what, optional=True),
            node=_require(obj, "node", str, what, optional=True),
            since=float(_require(obj, "since", (int, float), what, optional=True, check=math.isfinite,
                                 expected="a finite Redis time") or 0.0),
            payload=_require(obj, "payload", dict, what, optional=True) or {},
            rest=_require(obj, "rest", int, what, optional=True, check=nonneg, expected="an integer >= 0") or 0,
        )

    @classmethod
    def from_json(cls, raw: str | bytes, what: str = "subtask") -> Subtask:
        return cls.from_dict(loads_object(raw, what), what)

    @property
    def end(self) -> int:
        """The first page after the slice, its :attr:`rest` included: what the task gave this subtask."""
        return self.first_page + self.page_limit + self.rest

    def capped(self, pages: float) -> Subtask:
        """This subtask with at most ``pages`` pages (itself if it has no more): the slice's first pages only. The
        control keeps the pages it leaves out in :attr:`rest` when it places the subtask (after a one-page look,
        a subtask of their own instead), so nothing is skipped.

        >>> st = Subtask("s1", "t1", "a.example", first_page=4, page_limit=5, time_limit=30.0)
        >>> st.capped(2).page_limit, st.capped(2).first_page, st.capped(9) is st
        (2, 4, True)
        """
        return self if self.page_limit <= pages else replace(self, page_limit=max(1, int(pages)))

    def is_capped_of(self, original: Subtask) -> bool:
        """True if this is ``original`` itself or ``original.capped(n)`` for some ``n``: what an allocation
        strategy may assign for it (:class:`~scheduler_ext.strategies.Allocation`)."""
        return self is original or (1 <= self.page_limit < original.page_limit
                                    and replace(self, page_limit=original.page_limit) == original)


def resume_page(first_page: int, page_limit: int, done: Container[int]) -> int:
    """The first page of the slice ``[first_page, first_page + page_limit)`` from which every page to its end is in
    ``done`` (:attr:`Report.resume_page`).

    >>> resume_page(0, 5, {0, 2, 3, 4}), resume_page(0, 5, {0, 1}), resume_page(3, 2, {3, 4})
    (2, 5, 3)
    """
    page = first_page + page_limit
    while page > first_page and page - 1 in done:
        page -= 1
    return page


@dataclass
class Task:
    """One query (one site, one engine): its pages are crawled in slices, one subtask each, at most
    ``SCHEDEXT_TASK_LANES`` of them out at once, more than one only where its site runs dry (docs/control.md,
    step 3 of a tick).

    ``next_page`` is the first page no subtask was given; ``open`` counts the task's subtasks out (waiting,
    queued or crawling, recalled ones included), ``retrying`` those of them that were recalled (a recalled subtask
    out gives its task one more lane: docs/control.md, step 3)."""

    id: str
    site: str
    group: str = ""
    type: int = 0
    priority: float = 0.0
    payload: dict[str, Any] = field(default_factory=dict)
    next_page: int = 0
    total_pages: int | None = None  # known once a node has seen the engine-reported count
    reported: int | None = None
    subtasks: int = 0
    collected: int = 0
    done: bool = False
    last_node: str | None = None
    page_limit: int | None = None  # of the latest subtask
    time_limit: float | None = None
    open: int = 1
    retrying: int = 0

    def to_json(self) -> str:
        return _dumps(_fields(self))

    @classmethod
    def from_json(cls, raw: str) -> Task:
        obj = loads_object(raw, "task")
        _require(obj, "id", str, "task", check=bool, expected="a non-empty string")
        _require(obj, "site", str, "task", check=bool, expected="a non-empty string")
        counts = ("next_page", "open", "retrying", "subtasks", "collected")  # null or absent: the default
        for name in (*counts, "total_pages"):
            _require(obj, name, int, "task", optional=True, check=lambda v: v >= 0, expected="an integer >= 0")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in obj.items() if k in known and not (v is None and k in counts)})


@dataclass
class Report:
    """What a node says about one execution of a subtask (pushed to ``sleeping`` or ``failed``).

    ``outcome`` is "done" (all pages, or the end of results), "timeout" (the time limit cut it short; what was
    collected counts) or "failed" (``reason`` says why: a block page, an HTTP error, a download or storage error).

    ``attempted`` counts every page whose download started: the ``pages`` crawled, the ``blocked`` ones (a block
    page), the ``failed`` ones (HTTP, download or spider error) and those cut short by the time limit. Pages still in
    flight when the first one failed are counted too, however they end. The estimates charge them all
    (:attr:`charged`).
    """

    subtask: Subtask
    node: str
    outcome: str
    reason: str = ""
    reported: int | None = None  # engine-reported result count
    offered: int = 0  # results the engine should have shown on the pages crawled
    collected: int = 0  # results the node actually got
    pages: int = 0  # pages crawled
    next_page: int = 0  # first page of the task not yet crawled
    exhausted: bool = False  # the end of the results was reached
    total_pages: int | None = None
    started: float = 0.0
    ended: float = 0.0
    attempted: int | None = None  # pages whose download started (see the class doc); None: not counted
    blocked: int = 0  # of which answered by a block page
    failed: int = 0  # of which failed otherwise (HTTP, download or spider error)
    # Every page from this one to the slice's end was crawled (pages in flight when an earlier one failed); the
    # slice's end if its last page was not. None: not said (a node of an older version).
    resume_page: int | None = None
    # The node time the run used: the seconds its pages held the node's page slots (each attempted page from taking
    # a slot to giving it back), over the node's slots (Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN): what the run cost
    # the node, whatever else the node was crawling meanwhile. None: not measured (a node of an older version).
    node_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.outcome != "failed"

    @property
    def charged(self) -> int:
        """Pages attempted, as the estimates charge them: ``attempted``, and never fewer than the pages crawled,
        blocked and failed, nor, for a failed run, than the pages crawled plus the one that failed it (a report
        without counts: a malformed subtask, an item that failed in the pipelines, a node of an older version).

        >>> Report(Subtask("s", "t", "a.com", 0, 5, 10.0), "n1", "failed", pages=2, attempted=6, blocked=3).charged
        6
        >>> Report(Subtask("s", "t", "a.com", 0, 5, 10.0), "n1", "failed", pages=2).charged
        3
        """
        return max(self.attempted or 0, self.pages + self.blocked + self.failed, self.pages + (0 if self.ok else 1))

    @property
    def seconds(self) -> float:
        return max(0.0, self.ended - self.started)

    def to_dict(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "subtask"}
        return {"v": SCHEMA_VERSION, **d, "subtask": _fields(self.subtask)}

    def to_json(self) -> str:
        return _dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: str) -> Report:
        obj = loads_object(raw, "report")
        obj.pop("v", None)
        sub = obj.pop("subtask", None)
        if not isinstance(sub, dict):
            raise InvalidInput(f"report: field 'subtask': expected an object, got {sub!r}")
        _require(obj, "node", str, "report", check=bool, expected="a node id")
        _require(obj, "outcome", str, "report", check=lambda v: v in ("done", "timeout", "failed"),
                 expected="one of done, timeout, failed")
        nonneg = lambda v: v >= 0  # noqa: E731
        for name in ("offered", "collected", "pages", "next_page", "attempted", "blocked", "failed"):
            _require(obj, name, int, "report", optional=True, check=nonneg, expected="an integer >= 0")
        parts = sum(obj.get(name) or 0 for name in ("pages", "blocked", "failed"))
        if obj.get("attempted") is not None and obj["attempted"] < parts:
            raise InvalidInput(f"report: field 'attempted': expected at least pages + blocked + failed ({parts}), "
                               f"got {obj['attempted']!r}")
        for name in ("reported", "total_pages", "resume_page"):
            _require(obj, name, int, "report", optional=True, check=nonneg, expected="an integer >= 0 or null")
        for name in ("started", "ended"):
            _require(obj, name, (int, float), "report", optional=True, expected="a number of seconds")
        _require(obj, "node_seconds", (int, float), "report", optional=True, check=lambda v: 0 <= v < math.inf,
                 expected="a finite number of seconds >= 0 or null")
        _require(obj, "exhausted", bool, "report", optional=True)
        _require(obj, "reason", str, "report", optional=True)
        known = set(cls.__dataclass_fields__)
        return cls(subtask=Subtask.from_dict(sub, "report.subtask"), **{k: v for k, v in obj.items() if k in known})
