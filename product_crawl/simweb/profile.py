"""Simulated-web profiles: how well each crawl node (source address) is served by each site, over time.

A profile is a JSON object (the format is documented field by field in docs/simweb.md)::

    {"name": "paper",
     "corpus": {"min": 300, "max": 3000},
     "default": {"share": 0.3, "latency": {"mean": 0.3, "spread": 0.1},
                 "error_rate": 0.05, "block_rate": 0.05},
     "nodes": {"127.0.0.2": {"label": "node1", "share": 0.2,
                             "sites": {"12315.com": {"share": 0.95, "latency": {"mean": 0.1, "spread": 0.03},
                                                     "phases": [{"after": 40, "share": 0.1}]}}}}}

Resolution for (address, site) at ``elapsed`` seconds since the server started: start from ``default``, then
apply the node's own fields, then the node's entry for the site. At each of these three levels the level's
fields apply first and then, in order, each of its ``phases`` whose ``after`` <= elapsed. Unknown addresses
get ``default``; a known node asked about an unknown site gets ``default`` updated by the node's own fields.
:meth:`Profile.behaviour` is that resolution, a pure function of its arguments.
"""

from __future__ import annotations

import ipaddress
import json
import math
import pkgutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "BUILTIN_PROFILES",
    "Behaviour",
    "Latency",
    "Phase",
    "Profile",
    "ProfileError",
    "Rule",
    "load_profile",
]

#: Profiles shipped in product_crawl/simweb/profiles/, by name.
BUILTIN_PROFILES = ("paper", "duel", "alike")

_RULE_FIELDS = ("share", "latency", "error_rate", "block_rate")

#: Seconds: the longest latency mean or spread. A request waits that long; a longer one only hangs the crawl.
MAX_LATENCY = 600.0
#: Seconds: the latest a phase may start (a week); experiments run for minutes, a larger value is a typo.
MAX_PHASE_AFTER = 7 * 86400.0


class ProfileError(ValueError):
    """Raised if a profile cannot be read or does not validate; the message names the file and the field."""


@dataclass(frozen=True)
class Latency:
    """Response delay in seconds: uniform in [mean - spread, mean + spread], never below 0."""

    mean: float
    spread: float = 0.0


@dataclass(frozen=True)
class Behaviour:
    """How a site treats a node at one moment: the fraction of each page's results actually served, the
    response delay, and the probabilities of an HTTP 503 and of a captcha page (status 200)."""

    share: float
    latency: Latency
    error_rate: float
    block_rate: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "share": self.share,
            "latency": {"mean": self.latency.mean, "spread": self.latency.spread},
            "error_rate": self.error_rate,
            "block_rate": self.block_rate,
        }


@dataclass(frozen=True)
class Phase:
    """Overrides that take effect ``after`` seconds since the server started."""

    after: float
    overrides: dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """Partial behaviour at one level (default, node, or node and site) plus its phases."""

    overrides: dict[str, Any] = field(default_factory=dict)
    phases: tuple[Phase, ...] = ()

    def apply(self, behaviour: Behaviour, elapsed: float) -> Behaviour:
        """``behaviour`` updated by this rule's fields, then by each phase already started at ``elapsed``."""
        behaviour = replace(behaviour, **self.overrides)
        for phase in self.phases:
            if phase.after <= elapsed:
                behaviour = replace(behaviour, **phase.overrides)
        return behaviour


@dataclass(frozen=True)
class NodeProfile:
    """One crawl node, known by its source address: a label, its own fields and its per-site entries."""

    label: str
    rule: Rule
    sites: dict[str, Rule]


@dataclass(frozen=True)
class Profile:
    """A validated profile. ``raw`` is the JSON object it was read from; ``source`` names where."""

    name: str
    corpus_min: int
    corpus_max: int
    default: Rule
    nodes: dict[str, NodeProfile]
    source: str
    raw: dict[str, Any]

    def behaviour(self, address: str, site: str, elapsed: float) -> Behaviour:
        """Behaviour for requests from ``address`` for ``site`` at ``elapsed`` seconds after start."""
        behaviour = self.default.apply(_PLACEHOLDER, elapsed)
        node = self.nodes.get(normalize_address(address))
        if node is not None:
            behaviour = node.rule.apply(behaviour, elapsed)
            site_rule = node.sites.get(site.lower())
            if site_rule is not None:
                behaviour = site_rule.apply(behaviour, elapsed)
        return behaviour

    def label(self, address: str) -> str:
        """The node label of ``address``, or the address itself for unknown nodes."""
        node = self.nodes.get(normalize_address(address))
        return node.label if node is not None else address

    def to_dict(self) -> dict[str, Any]:
        """The profile as JSON-ready data: the file's object with the defaults filled in."""
        data = dict(self.raw)
        data["name"] = self.name
        data["corpus"] = {"min": self.corpus_min, "max": self.corpus_max}
        data["source"] = self.source
        return data


# Every field of ``default`` is required, so this is always fully overwritten.
_PLACEHOLDER = Behaviour(share=0.0, latency=Latency(0.0), error_rate=0.0, block_rate=0.0)


def phase_times(profile: Profile) -> list[float]:
    """Every ``after`` of the profile's phases, sorted: when the truth changes."""
    rules = [profile.default] + [n.rule for n in profile.nodes.values()]
    rules += [r for n in profile.nodes.values() for r in n.sites.values()]
    return sorted({p.after for r in rules for p in r.phases})


def normalize_address(address: str) -> str:
    """``address`` without the IPv4-mapped IPv6 prefix, so ``::ffff:127.0.0.2`` finds ``127.0.0.2``."""
    return address[7:] if address.startswith("::ffff:") else address


def load_profile(spec: str | Path) -> Profile:
    """The built-in profile named ``spec`` (see :data:`BUILTIN_PROFILES`) or the profile file ``spec``.

    Built-in profiles are read with :func:`pkgutil.get_data` so they load from a zipped egg too.
    Raises :class:`ProfileError` naming the file, and the field if the content is at fault.
    """
    spec_str = str(spec)
    if spec_str in BUILTIN_PROFILES:
        source = f"built-in profile {spec_str!r}"
        data = pkgutil.get_data("product_crawl.simweb", f"profiles/{spec_str}.json")
        if data is None:  # a loader that cannot read package data
            raise ProfileError(f"{source}: cannot read package data profiles/{spec_str}.json")
        text = data.decode("utf-8")
    else:
        source = f"profile file {spec_str!r}"
        try:
            text = Path(spec_str).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            known = ", ".join(BUILTIN_PROFILES)
            raise ProfileError(f"{source}: cannot read it ({exc}); built-in profiles: {known}") from exc
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{source}: not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ProfileError(f"{source}: not a profile: JSON nested too deeply") from exc
    return parse_profile(obj, source)


def parse_profile(obj: Any, source: str = "<profile>") -> Profile:
    """Validate the decoded JSON ``obj`` of a profile; ``source`` names it in error messages."""
    v = _Validator(source)
    top = v.object(
        obj, "", required=("name", "default"), allowed=("name", "description", "corpus", "default", "nodes")
    )
    name = v.string(top["name"], "name")
    if "description" in top:
        v.string(top["description"], "description", allow_empty=True)
    corpus_min, corpus_max = 300, 3000
    if "corpus" in top:
        corpus = v.object(top["corpus"], "corpus", required=("min", "max"), allowed=("min", "max"))
        corpus_min = v.integer(corpus["min"], "corpus.min", minimum=1)
        corpus_max = v.integer(corpus["max"], "corpus.max", minimum=1)
        if corpus_max < corpus_min:
            v.fail("corpus.max", f"expected an integer >= corpus.min ({corpus_min})", corpus_max)
    default = v.rule(top["default"], "default", required=_RULE_FIELDS)
    nodes: dict[str, NodeProfile] = {}
    raw_nodes = v.object(top.get("nodes", {}), "nodes")
    for address, raw_node in raw_nodes.items():
        path = f"nodes.{address}"
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            v.fail(path, "expected an IP address as the key", address)
        node_obj = v.object(raw_node, path, allowed=(*_RULE_FIELDS, "phases", "label", "sites"))
        label = v.string(node_obj.get("label", str(parsed)), f"{path}.label")
        node_rule = v.rule({k: val for k, val in node_obj.items() if k not in ("label", "sites")}, path)
        sites = {}
        for site, raw_site in v.object(node_obj.get("sites", {}), f"{path}.sites").items():
            if not site or "/" in site or " " in site:
                v.fail(f"{path}.sites.{site}", "expected a bare domain as the key", site)
            sites[site.lower()] = v.rule(raw_site, f"{path}.sites.{site}")
        nodes[str(parsed)] = NodeProfile(label=label, rule=node_rule, sites=sites)
    return Profile(
        name=name,
        corpus_min=corpus_min,
        corpus_max=corpus_max,
        default=default,
        nodes=nodes,
        source=source,
        raw=top,
    )


class _Validator:
    """Checks of JSON values that raise :class:`ProfileError` with the source and the field path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, expected: str, got: Any) -> NoReturn:
        where = path or "(top level)"
        raise ProfileError(f"{self.source}: {where}: {expected}, got {got!r}")

    def object(
        self,
        value: Any,
        path: str,
        required: tuple[str, ...] = (),
        allowed: tuple[str, ...] | None = None,
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, "expected an object", value)
        prefix = f"{path}." if path else ""
        for key in required:
            if key not in value:
                self.fail(f"{prefix}{key}", "missing required field", None)
        if allowed is not None:
            for key in value:
                if key not in allowed:
                    self.fail(f"{prefix}{key}", f"unknown field (expected one of: {', '.join(allowed)})", key)
        return value

    def number(
        self, value: Any, path: str, minimum: float | None = None, maximum: float | None = None
    ) -> float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if ok and minimum is not None and value < minimum:
            ok = False
        if ok and maximum is not None and value > maximum:
            ok = False
        if not ok:
            if minimum is not None and maximum is not None:
                expected = f"expected a number in [{_fmt(minimum)}, {_fmt(maximum)}]"
            elif minimum is not None:
                expected = f"expected a number >= {_fmt(minimum)}"
            else:
                expected = "expected a number"
            self.fail(path, expected, value)
        return float(value)

    def integer(self, value: Any, path: str, minimum: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            self.fail(path, f"expected an integer >= {minimum}", value)
        return int(value)

    def string(self, value: Any, path: str, allow_empty: bool = False) -> str:
        if not isinstance(value, str) or (not value and not allow_empty):
            self.fail(path, "expected a non-empty string", value)
        return str(value)

    def fields(self, obj: dict[str, Any], path: str) -> dict[str, Any]:
        """The behaviour fields present in ``obj``, validated and converted."""
        out: dict[str, Any] = {}
        for key in ("share", "error_rate", "block_rate"):
            if key in obj:
                out[key] = self.number(obj[key], f"{path}.{key}", 0, 1)
        if "latency" in obj:
            lat = self.object(
                obj["latency"], f"{path}.latency", required=("mean",), allowed=("mean", "spread")
            )
            mean = self.number(lat["mean"], f"{path}.latency.mean", minimum=0, maximum=MAX_LATENCY)
            spread = self.number(lat.get("spread", 0.0), f"{path}.latency.spread", minimum=0, maximum=MAX_LATENCY)
            out["latency"] = Latency(mean, spread)
        return out

    def rule(self, value: Any, path: str, required: tuple[str, ...] = ()) -> Rule:
        obj = self.object(value, path, required=required, allowed=(*_RULE_FIELDS, "phases"))
        phases: list[Phase] = []
        raw_phases = obj.get("phases", [])
        if not isinstance(raw_phases, list):
            self.fail(f"{path}.phases", "expected a list", raw_phases)
        for i, raw_phase in enumerate(raw_phases):
            ppath = f"{path}.phases[{i}]"
            pobj = self.object(raw_phase, ppath, required=("after",), allowed=("after", *_RULE_FIELDS))
            after = self.number(pobj["after"], f"{ppath}.after", minimum=0, maximum=MAX_PHASE_AFTER)
            if phases and after <= phases[-1].after:
                self.fail(
                    f"{ppath}.after", f"expected phases sorted by 'after' (> {_fmt(phases[-1].after)})", after
                )
            phases.append(Phase(after=after, overrides=self.fields(pobj, ppath)))
        return Rule(overrides=self.fields(obj, path), phases=tuple(phases))


def _fmt(x: float) -> str:
    return f"{x:g}"
