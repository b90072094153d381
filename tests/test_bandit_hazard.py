"""The bandit's estimate of when pairs change treatment (:class:`~scheduler_ext.strategies.bandit.ChangeHazard`)
and how it re-opens stale evidence. Pure logic over in-memory estimates: no service involved."""

from __future__ import annotations

import math
import random

from scheduler_ext.models import Subtask
from scheduler_ext.sim.estimates import MemoryEstimates
from scheduler_ext.strategies import NodeView
from scheduler_ext.strategies.bandit import PROBE_PAGES, BanditAllocation, ChangeHazard


def test_change_hazard_is_the_share_of_watched_pairs_that_changed() -> None:
    h = ChangeHazard(width=5.0)
    for i in range(40):  # 40 pairs watched across 100..101 s; 10 of them change there
        h.watch(100.0, 101.0)
        if i < 10:
            h.change(100.0, 101.0)
    for _ in range(40):  # and watched, without change, before and after
        h.watch(0.0, 100.0)
        h.watch(101.0, 300.0)
    burst = h.cumulative(0.0, 300.0)
    assert math.isclose(1 - math.exp(-burst), 0.25, abs_tol=0.05)  # about a quarter changed
    assert h.cumulative(0.0, 95.0) == 0.0  # up to 95 s nothing changed
    assert h.cumulative(110.0, 300.0) == 0.0  # a pair seen after the burst has no reason to have changed


def test_a_change_seen_late_goes_to_the_burst_already_located() -> None:
    h = ChangeHazard(width=5.0)
    for i in range(20):  # 20 pairs run every second around 100 s; 5 change between 100 and 101 s
        h.watch(100.0, 101.0)
        if i < 5:
            h.change(100.0, 101.0)
    h.watch(0.0, 200.0)  # a pair not run from 0 to 200 s turns out changed: when in between is not known
    h.change(0.0, 200.0)
    late = h.changes[20] - 5.0  # the late change's share in the bin of 100..105 s
    assert late > 4 * 5.0 / 200.0  # several times its share by time alone (1/40)
    assert math.isclose(sum(h.changes.values()), 6.0)  # and it still counts as one change
    assert h.cumulative(0.0, 95.0) < h.cumulative(95.0, 105.0)


def test_a_change_found_stands_for_the_changes_of_the_pairs_not_watched() -> None:
    h = ChangeHazard(width=5.0)
    for _ in range(10):  # 10 pairs watched across 100..105 s, one of them changed; the cluster has 40 pairs
        h.watch(100.0, 105.0)
    assert math.isclose(h.change(100.0, 105.0) * 40, 4.0)  # so about 4 of the 40 changed (Horvitz-Thompson)
    for _ in range(30):  # had all 40 been watched, the change would stand for itself
        h.watch(200.0, 205.0)
    for _ in range(10):
        h.watch(200.0, 205.0)
    assert math.isclose(h.change(200.0, 205.0) * 40, 1.0)


def test_change_hazard_without_changes_is_zero_however_long() -> None:
    h = ChangeHazard()
    for t in range(0, 36_000, 7):
        h.watch(float(t), t + 7.0)
    assert h.cumulative(0.0, 36_000.0) == 0.0


def test_change_hazard_forgets_beyond_its_bins() -> None:
    h = ChangeHazard(width=1.0, keep=10)
    h.watch(0.0, 5.0)
    h.change(0.0, 5.0)
    h.watch(100.0, 105.0)
    h.change(100.0, 105.0)
    assert math.isclose(h.cumulative(0.0, 200.0), 1.0)  # only the change within the last 10 bins remains


def subtask(sid: str, now: float) -> Subtask:
    return Subtask(id=sid, task=f"t{sid}", site="a.com", first_page=0, page_limit=10, time_limit=60.0, group="g",
                   since=now)


def run(est: MemoryEstimates, node: str, now: float, *, good: bool, site: str = "a.com") -> None:
    est.finish(site=site, group="g", node=node, offered=100, collected=95 if good else 10, pages=10,
               seconds=1.0 if good else 4.0, ok=True, now=now)
    est.read()


def test_a_pair_that_turned_bad_counts_at_once_one_that_turned_good_once_its_next_run_confirms_it() -> None:
    strategy = BanditAllocation()
    est = MemoryEstimates()
    nodes = [NodeView(id="n1", types=[0], free=0)]  # "x" is free: a tick with a free slot reads the estimates
    t = 1.0

    def tick(good: bool) -> float:
        run(est, "n1", t, good=good)
        strategy.allocate([subtask("s", t)], [*nodes, NodeView(id="x", types=[0], free=1)], est, t)
        return sum(strategy.hazard.changes.values())

    for _ in range(5):  # a good pair, run every second
        assert tick(True) == 0.0
        t += 1
    # A bad run: a change point. Nothing is sent to a pair that turned bad, so no run may ever confirm it: it
    # counts at once (pairs last seen before it may have changed too); what it grants waits for a confirmation.
    assert math.isclose(tick(False), 1.0) and strategy.hazard.cumulative(0.0, t + 1) > 0.0
    assert strategy.granted == 0.0
    t += 1
    # Taken back by the next run, itself a change point to good: that one waits for the pair's next run.
    assert tick(True) == 0.0 and strategy.granted == 0.0
    t += 1
    assert math.isclose(tick(True), 1.0) and strategy.granted > 0.0  # confirmed: counted, and it grants
    granted = strategy.granted
    t += 1
    assert math.isclose(tick(False), 2.0)  # a fluke of a good pair counts at once ...
    t += 1
    assert math.isclose(tick(True), 1.0) and strategy.granted == granted  # ... and is taken back by the next run


def explorations_of_stale_pair(burst: bool, credit: float = 1.0) -> int:
    """Runs of ``stale`` on a.com (measured bad five times by 5 s) the bandit sends over 20 ticks after 100 s, with and
    without a burst of confirmed changes on other sites between its run and now; ``credit``: the exploration
    budget at each of those ticks."""
    strategy = BanditAllocation(seed=3)
    est = MemoryEstimates()
    for t in range(1, 6):
        run(est, "stale", float(t), good=False)
    for t in range(1, 100):  # "good" serves a.com every second; eight watched pairs on b.com
        run(est, "good", float(t), good=True)
        for i in range(8):
            changed = burst and i < 4 and t >= 50
            run(est, f"w{i}", float(t), good=not changed, site="b.com")
        subtasks = [subtask("s", float(t)), Subtask(id="b", task="tb", site="b.com", first_page=0, page_limit=10,
                                                     time_limit=60.0, group="g", since=float(t))]
        strategy.allocate(subtasks, [NodeView(id=n, types=[0], free=int(n == "good")) for n in
                                     ("good", "stale", *(f"w{i}" for i in range(8)))], est, float(t))
    sent = 0
    for t in range(100, 120):
        strategy.credit = credit
        # Explorations only: "stale" has work waiting in its queue, so it also probes as it earns probes (one-page
        # looks, tested in test_strategies.py, not counted); what re-opens its evidence for these is the change hazard
        result = strategy.allocate([subtask(f"s{t}", float(t))], [NodeView(id="good", types=[0], free=0),
                                                                    NodeView(id="stale", types=[0], free=1, queued=1)],
                                   est, float(t))
        sent += sum(1 for s, n in result if n == "stale" and s.page_limit > PROBE_PAGES)
        strategy._exploring.clear()  # as if each exploration came back at once, still bad: measured again
    return sent


def test_a_burst_of_confirmed_changes_reopens_stale_evidence() -> None:
    assert explorations_of_stale_pair(burst=True) > explorations_of_stale_pair(burst=False)


def test_changes_found_grant_explorations_of_stale_pairs_beyond_the_budget() -> None:
    # With no budget left, the changes found on b.com (4 of its 8 pairs, each standing for the pairs not seen since)
    # still pay for re-exploring the pair whose evidence predates them; without changes, nothing is explored.
    assert explorations_of_stale_pair(burst=True, credit=0.0) > 0
    assert explorations_of_stale_pair(burst=False, credit=0.0) == 0


def test_long_intervals_watched_add_what_a_pass_over_their_bins_adds() -> None:
    # A pair last run an hour ago covers 720 bins: its whole bins are added when the watched seconds are next read
    # (a difference array), its partial first and last bins at once. The bins hold what adding the interval's part
    # of each bin, bin by bin, gives (up to the order of the additions), read between watches or not; the hazard and
    # its cumulative follow.
    rng = random.Random(3)
    deferred, plain = ChangeHazard(width=5.0), ChangeHazard(width=5.0)
    for step in range(400):
        t1 = rng.uniform(0, 8000)
        t0 = t1 - rng.choice([rng.uniform(0, 12), rng.uniform(0, 4000), 5.0 * rng.randint(1, 800)])
        deferred.watch(t0, t1)
        plain._spread(plain._watched, t0, t1, None)  # bin by bin
        if step % 50 == 49:
            assert math.isclose(deferred.change(t0, t1), plain.change(t0, t1), rel_tol=1e-9)
            got, want = deferred.watched, plain.watched
            assert got.keys() == want.keys()
            assert all(math.isclose(got[b], want[b], rel_tol=1e-12) for b in want)
            assert math.isclose(deferred.cumulative(t0, t1 + 60), plain.cumulative(t0, t1 + 60), rel_tol=1e-9)
    fresh = ChangeHazard(width=5.0)
    fresh.watch(2.5, 3602.5)  # an hour: two partial bins now, the 719 whole ones as two entries
    assert len(fresh._watched) == 2 and len(fresh._whole) == 2
    assert len(fresh.watched) == 721 and math.isclose(sum(fresh.watched.values()), 3600.0)
