"""Where a real run's page slots went: the pairs each configuration crawled, against the profile's truth.

    python benchmarks/diag_pairs.py RUN_DIR [RUN_DIR ...] [--profile paper]

``RUN_DIR`` is a ``scrapy experiment --out`` folder (of a real run or of ``--sim``); its
``raw/<configuration>.json`` holds the samples of every (node, site) pair's pages crawled. A node's page slots
are its capacity (8 requests at a time to the engine's host), so a page costs the slot its site's latency for
that node; a pair's worth per slot-second is share / latency. Per configuration, the pages and the slot-seconds
(pages x the profile's latency at the time) on:

* ``best``: the node's best pair at the time (at least 0.95 of its highest share / latency over the sites);
* ``other``: a pair worth at least 0.3 of the node's best (a suited site, not its best);
* ``poor``: the rest (explorations, pairs that turned bad, sites that do not suit the node);

and the mean latency of the pages (the oracle's schedule is about each node's best latency). Blocked and failed
pages are not in the samples: the slot-seconds of ``poor`` are a lower bound. Not timed; reads files only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from product_crawl.simweb.profile import Profile, load_profile  # noqa: E402

BEST, OTHER = 0.95, 0.3


def worth(profile: Profile, address: str, site: str, t: float) -> tuple[float, float]:
    """(share / latency, latency) of the pair at ``t`` seconds into the run."""
    b = profile.behaviour(address, site, t)
    latency = max(1e-3, b.latency.mean)
    return b.share / latency, latency


def slots(raw: dict, profile: Profile, sites: list[str]) -> dict[str, float]:
    addresses = {node.label: address for address, node in profile.nodes.items()}  # a simulated run's nodes
    addresses.update({label: address for address, label in raw.get("web", {}).get("labels", {}).items()})
    pages = {"best": 0.0, "other": 0.0, "poor": 0.0}
    seconds = dict(pages)
    seen: dict[str, int] = {}
    last_t = 0.0
    for sample in raw["samples"]:
        t = (last_t + sample["t"]) / 2
        last_t = sample["t"]
        for key, counts in sample.get("pairs", {}).items():
            node, site = key.split("|", 1)
            new = counts[3] - seen.get(key, 0)
            seen[key] = counts[3]
            if new <= 0 or node not in addresses:
                continue
            best = max(worth(profile, addresses[node], s, t)[0] for s in sites)
            rate, latency = worth(profile, addresses[node], site, t)
            kind = "best" if rate >= BEST * best else "other" if rate >= OTHER * best else "poor"
            pages[kind] += new
            seconds[kind] += new * latency
    total = sum(seconds.values()) or 1.0
    out = {f"{k}_pages": int(v) for k, v in pages.items()}
    out.update({f"{k}_slot_share": round(v / total, 3) for k, v in seconds.items()})
    out["mean_latency"] = round(total / max(1.0, sum(pages.values())), 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--profile", default="paper")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    for run in args.runs:
        for path in sorted((run / "raw").glob("*.json")):
            raw = json.loads(path.read_text(encoding="utf-8"))
            # every site the run crawled and every site the profile rates a node on: a node's best site counts
            # even if the run never sent it there
            sites = sorted({k.split("|", 1)[1] for s in raw["samples"] for k in s.get("pairs", {})}
                           | {site for node in profile.nodes.values() for site in node.sites})
            print(json.dumps({"run": str(run), "configuration": raw.get("name", path.stem),
                              **slots(raw, profile, sites)}))


if __name__ == "__main__":
    main()
