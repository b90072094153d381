"""What ``scrapy cluster`` schedules where, and how scrapyd's jobs map to nodes. Pure: no network, no Redis.

A job's id is ``<name>.<stamp>``: the name is the node id (``<target>-n<i>``) or control id (``<target>-control``,
``<target>-standby``), so ``status`` and ``down`` know which job is which node without any state of their own,
and a later ``up`` sees which names already run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from product_crawl.deploy.scrapyd import DeployError, Target

#: Settings ``up`` sets itself for each job; ``--set`` may not give them.
JOB_SETTINGS = ("SCHEDEXT_NODE_ID", "SCHEDEXT_BIND_ADDRESS", "SCHEDEXT_NODE_TYPE", "SCHEDEXT_CONTROL_ID")
#: Settings that carry secrets: scrapyd turns job settings into ``-s NAME=VALUE`` arguments, which ``ps`` shows.
SECRET_SETTINGS = ("REDIS_URL", "REDIS_PARAMS", "MONGO_URI")
_URL_WITH_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]*@")
_SETTING_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
#: A node count: ASCII digits only (``str.isdigit`` also takes ``²`` and other digits ``int`` refuses or reads).
_COUNT = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Job:
    """One long-running scrapyd job: a crawl node (spider ``search``) or a control (spider ``control``)."""

    target: str
    spider: str
    name: str
    settings: dict[str, str]


def parse_nodes(text: str, targets: Mapping[str, Target]) -> dict[str, int]:
    """``host11=2,host12=1`` -> ``{"host11": 2, "host12": 1}``, in the order given.

    >>> parse_nodes("a=2, b=0", {"a": Target("a", "http://a", "p"), "b": Target("b", "http://b", "p")})
    {'a': 2, 'b': 0}
    """
    counts: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        name, sep, number = part.partition("=")
        name = name.strip()
        if not sep or not _COUNT.fullmatch(number.strip()):
            raise DeployError(f"--nodes: expected TARGET=N[,TARGET=N...], got {part!r}")
        if name not in targets:
            raise DeployError(f"--nodes: unknown target {name!r}; scrapy.cfg has: {', '.join(sorted(targets))}")
        if name in counts:
            raise DeployError(f"--nodes: target {name!r} is given twice")
        counts[name] = int(number)
    if not any(counts.values()):
        raise DeployError("--nodes: expected at least one node")
    return counts


def parse_settings(pairs: Iterable[str]) -> dict[str, str]:
    """``--set NAME=VALUE`` options for every job; refuses secrets and the settings ``up`` sets itself."""
    settings: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not _SETTING_NAME.fullmatch(name):
            raise DeployError(f"--set: expected NAME=VALUE with an upper-case setting name, got {pair!r}")
        if name in SECRET_SETTINGS or _URL_WITH_PASSWORD.search(value):
            raise DeployError(f"--set {name}: secrets never go in job settings (scrapyd passes them as command-line "
                              "arguments, which ps shows); put REDIS_URL and MONGO_URI in scrapyd's environment")
        if name in JOB_SETTINGS:
            raise DeployError(f"--set {name}: set by scrapy cluster up for each job (from scrapy.cfg)")
        settings[name] = value
    return settings


def plan_jobs(counts: Mapping[str, int], targets: Mapping[str, Target], settings: Mapping[str, str],
              controls: int = 2) -> list[Job]:
    """Nodes ``<target>-n1..nN`` per target, then a control on the first target and a standby on the next one.

    Node ``i`` of a target binds the ``i``-th of the target's ``node_addresses`` (none configured: the default
    address); asking for more nodes than addresses is an error naming the target.
    """
    jobs: list[Job] = []
    for name, n in counts.items():
        target = targets[name]
        if target.node_addresses and n > len(target.node_addresses):
            raise DeployError(f"--nodes {name}={n}: target {name} has only {len(target.node_addresses)} "
                              f"node_addresses in scrapy.cfg ({', '.join(target.node_addresses)})")
        for i in range(1, n + 1):
            node_settings = {**settings, "SCHEDEXT_NODE_ID": f"{name}-n{i}", "SCHEDEXT_NODE_TYPE": target.node_types}
            if target.node_addresses:
                node_settings["SCHEDEXT_BIND_ADDRESS"] = target.node_addresses[i - 1]
            jobs.append(Job(name, "search", f"{name}-n{i}", node_settings))
    hosts = list(counts)
    for i, role in enumerate(("control", "standby")[:controls]):
        name = hosts[i % len(hosts)]
        control_id = f"{name}-{role}"
        jobs.append(Job(name, "control", control_id, {**settings, "SCHEDEXT_CONTROL_ID": control_id}))
    return jobs


def job_id(name: str, stamp: str) -> str:
    """The scrapyd job id of a node or control.

    >>> job_id("host11-n1", "20261201T0102")
    'host11-n1.20261201T0102'
    """
    return f"{name}.{stamp}"


def name_of(jobid: str) -> str | None:
    """The node or control id in a job id that :func:`job_id` made, else None.

    >>> name_of("host11-n1.20261201T0102"), name_of("3f2a9c")
    ('host11-n1', None)
    """
    name, sep, _ = jobid.rpartition(".")
    return name if sep and name else None


def job_rows(jobs: Mapping[str, Mapping[str, list[dict[str, Any]]]], nodes: Iterable[Mapping[str, Any]]
             ) -> list[dict[str, Any]]:
    """scrapyd's pending and running jobs per target joined with the node registry (``collect_status``'s nodes).

    One row per job: target, job id, spider, state, pid, node (or control) id, and for nodes whether the registry
    has it alive and the subtasks it holds. Then one row per registered node that no job explains (started by
    hand, or a job that died without deregistering), with target ``-``.
    """
    registry = {str(n["id"]): n for n in nodes}
    rows, seen = [], set()
    for target, lists in jobs.items():
        for state in ("running", "pending"):
            for job in lists.get(state, []):
                name = name_of(str(job["id"]))
                node = registry.get(name or "")
                seen.add(name)
                rows.append({"target": target, "job": job["id"], "spider": job.get("spider"), "state": state,
                             "pid": job.get("pid"), "name": name,
                             "alive": None if node is None else bool(node.get("alive")),
                             "subtasks": list(node.get("subtasks") or []) if node else []})
    for name, node in sorted(registry.items()):
        if name not in seen:
            rows.append({"target": "-", "job": "-", "spider": "search", "state": "-", "pid": None, "name": name,
                         "alive": bool(node.get("alive")), "subtasks": list(node.get("subtasks") or [])})
    return rows



#: Redis ACL rules of each role, after ``ACL SETUSER <user> on >PASSWORD``. Every role is confined to the
#: deployment's keys; all changes happen in Lua scripts, so node and control need the same data commands, and what
#: they lack is what could hurt the server or other deployments (``@dangerous``: KEYS, FLUSHALL, CONFIG, DEBUG, ...).
_WRITER = "-@all +@read +@write +@transaction +@connection -@dangerous +evalsha +eval +script|load +script|exists +time"
ACL_ROLES = {
    "node": _WRITER,
    "control": _WRITER,
    "viewer": "-@all +@read +@connection -@dangerous +time",
}


def acl_rules(role: str, prefix: str) -> str:
    """The ACL rules of ``role`` for the deployment with key prefix ``prefix``.

    >>> acl_rules("viewer", "{pc}")
    'resetkeys ~{pc}:* resetchannels -@all +@read +@connection -@dangerous +time'
    """
    return f"resetkeys ~{prefix}:* resetchannels {ACL_ROLES[role]}"
