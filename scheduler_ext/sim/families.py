"""Generated worlds for the scheduling-quality benchmarks: families of profiles, each drawn from a seed.

Every family starts from the same two kinds of pair, drawn per (node, site) with some jitter:

* *suited*: nearly every result served, fast pages, (almost) no errors or captchas (the paper's suited pairs);
* *unsuited*: a fifth to a third of the results, slow pages, ~10 % errors and ~5 % captchas.

and differs in which pairs are which, and in how that changes over time:

``specialists``   each node suits 1-3 sites (the paper's situation)
``generalists``   each node suits about 60 % of the sites, unevenly
``drift``         specialists; at 37 % and 71 % of the run a quarter of the pairs swap kinds (suited pairs turn
                  bad, unsuited pairs turn good)
``unlucky``       specialists whose suited pairs fail their first pages: a suited pair answers errors for its first
                  few seconds, then serves well (a single early run says nothing)
``captcha``       specialists; a third of the nodes get captchas on most pages of every site, but the pages they do
                  get are full (served share on success 0.95, block rate 0.6)
``unsuitable``    specialists, plus a quarter of the sites no node suits
``churn``         specialists; a fifth of the nodes join late and a fifth leave in the middle of the run
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field

from .bound import GOOD, NOT_GOOD
from .engine import SimNode
from .world import Behaviour

FAMILIES = ("specialists", "generalists", "drift", "unlucky", "captcha", "unsuitable", "churn")


def suited(rng: random.Random) -> Behaviour:
    return Behaviour(share=rng.uniform(0.88, 0.97), latency=rng.uniform(0.08, 0.2), spread=0.04,
                     error_rate=rng.uniform(0.0, 0.02), block_rate=0.0)


def unsuited(rng: random.Random) -> Behaviour:
    return Behaviour(share=rng.uniform(0.1, 0.3), latency=rng.uniform(0.4, 0.8), spread=0.15,
                     error_rate=rng.uniform(0.06, 0.12), block_rate=rng.uniform(0.03, 0.08))


@dataclass
class GeneratedWorld:
    """A world given pair by pair: ``pairs[(node, site)]`` is a list of (from time, behaviour), sorted."""

    name: str
    nodes: list[SimNode]
    sites: list[str]
    pairs: dict[tuple[str, str], list[tuple[float, Behaviour]]] = field(default_factory=dict)
    default: Behaviour = Behaviour(share=0.2, latency=0.6, spread=0.15, error_rate=0.1, block_rate=0.05)

    def behaviour(self, node: str, site: str, t: float) -> Behaviour:
        steps = self.pairs.get((node, site))
        if not steps:
            return self.default
        i = bisect.bisect_right([s[0] for s in steps], t) - 1
        return steps[max(0, i)][1]

    def changes(self) -> list[float]:
        return sorted({t for steps in self.pairs.values() for t, _ in steps if t > 0})

    def turned_good(self) -> list[tuple[str, str, float]]:
        """(node, site, when) of every pair that becomes suited after the start."""
        out = []
        for (n, s), steps in self.pairs.items():
            for (_, before), (t, after) in zip(steps, steps[1:], strict=False):
                if after.share * after.served >= GOOD and before.share * before.served < NOT_GOOD:
                    out.append((n, s, t))
        return out


def generate(family: str, *, nodes: int, sites: int, duration: float, seed: int) -> GeneratedWorld:
    """A world of ``family`` (see the module doc) with ``nodes`` nodes and ``sites`` sites."""
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {', '.join(FAMILIES)}, got {family!r}")
    rng = random.Random(f"{family}:{seed}")
    node_list = [SimNode(f"n{i}") for i in range(nodes)]
    site_list = [f"s{j}.example" for j in range(sites)]
    world = GeneratedWorld(family, node_list, site_list)
    usable = site_list
    if family == "unsuitable":
        usable = site_list[: max(1, math.ceil(sites * 0.75))]
    for n in node_list:
        if family == "generalists":
            good = {s for s in usable if rng.random() < 0.6}
        else:
            good = set(rng.sample(usable, min(len(usable), rng.randint(1, 3))))
        for s in site_list:
            b = suited(rng) if s in good else unsuited(rng)
            steps: list[tuple[float, Behaviour]] = [(0.0, b)]
            if family == "unlucky" and s in good:
                steps = [(0.0, Behaviour(b.share, b.latency, b.spread, error_rate=0.9)), (rng.uniform(3, 8), b)]
            world.pairs[(n.id, s)] = steps
    # Every site some node suits, so that the bound is not trivially low (except the unsuitable ones).
    for s in usable:
        if not any(world.pairs[(n.id, s)][-1][1].share > 0.8 for n in node_list):
            n = rng.choice(node_list)
            world.pairs[(n.id, s)] = [(0.0, suited(rng))]
    if family == "drift":
        for when in (round(0.37 * duration, 1), round(0.71 * duration, 1)):  # not on any strategy's timer
            for key in rng.sample(sorted(world.pairs), max(1, len(world.pairs) // 4)):
                now = world.pairs[key][-1][1]
                flipped = unsuited(rng) if now.share > 0.8 else suited(rng)
                world.pairs[key].append((when, flipped))
    if family == "captcha":
        for n in rng.sample(node_list, max(1, nodes // 3)):
            for s in site_list:
                world.pairs[(n.id, s)] = [(0.0, Behaviour(0.95, 0.15, 0.04, error_rate=0.0, block_rate=0.6))]
    if family == "churn":
        for n in rng.sample(node_list, max(1, nodes // 5)):
            n.joins = rng.uniform(0.2, 0.5) * duration
        for n in rng.sample([n for n in node_list if n.joins == 0], max(1, nodes // 5)):
            n.leaves = rng.uniform(0.4, 0.7) * duration
    return world
