"""adjustGroups (paper Fig. 5 and 6): contended uplinks and NICs kept in groups of two."""

import re

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dssync.errors import ScheduleError
from dssync.planning.planner import (
    adjusted_plan,
    base_plan,
    check_adjusted,
    check_paced,
    check_static,
    plan,
    static_plan,
    time_to_mix,
)
from dssync.topology import Topology


@st.composite
def contended_layouts(draw, max_racks=6, max_size=8):
    """2-6 racks of 1-8 workers, any set of slow uplinks (all of them included) and any set
    of slow NICs (whole racks included)."""
    sizes = draw(st.lists(st.integers(min_value=1, max_value=max_size), min_size=2, max_size=max_racks))
    racks = len(sizes)
    slow_uplinks = draw(st.lists(st.integers(0, racks - 1), unique=True, max_size=racks))
    n = sum(sizes)
    slow_nics = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    return sizes, sorted(slow_uplinks), sorted(slow_nics)


def partners_of(schedule, rank):
    return {next(r for r in g if r != rank) for p in schedule.period for g in p if rank in g and len(g) == 2}


def racks_of(topo, group):
    return {topo.rack_of(r) for r in group}


@settings(max_examples=100, deadline=None)
@given(contended_layouts())
def test_contended_links_are_in_pairs_every_round_and_the_plan_mixes(layout):
    sizes, slow_uplinks, slow_nics = layout
    topo = Topology.from_rack_sizes(sizes)
    schedule = adjusted_plan(topo, slow_uplinks=slow_uplinks, slow_nics=slow_nics)
    n = topo.world_size
    racks = topo.racks()
    all_slow = {k for k, rack in enumerate(racks) if set(rack) <= set(slow_nics)}
    narrow = set(slow_uplinks) | all_slow
    for partition in schedule.period:
        assert sorted(r for g in partition for r in g) == list(range(n))
        flows = dict.fromkeys(narrow, 0)
        for group in partition:
            crossing = len(racks_of(topo, group)) > 1
            for r in group:
                if r in slow_nics:  # a slow NIC: never in a group of more than two...
                    assert len(group) <= 2, (r, partition)
                    # ...and inside its rack while the rack has a clear NIC
                    assert not crossing or topo.rack_of(r) in all_slow, (r, partition)
                if crossing and topo.rack_of(r) in narrow:  # only pairs cross a slow uplink
                    assert len(group) == 2, (r, partition)
                    flows[topo.rack_of(r)] += 1
        assert all(k <= 1 for k in flows.values()), (flows, partition)  # one flow per slow uplink
    assert schedule.rho < 1
    # Clear racks with workers to spare (two clear NICs, three with slow ones beside them) meet
    # each other directly every round, whatever the slow racks do.
    spare = [k for k, rack in enumerate(racks) if k not in narrow
             and len(set(rack) - set(slow_nics)) >= 2 + bool(set(rack) & set(slow_nics))]
    if len(spare) > 1:
        for partition in schedule.period:
            assert any(set(spare) <= racks_of(topo, g) for g in partition), (spare, partition)
    # Every clear worker of a rack crosses racks as often as its rack-mates, within one round
    # (one per block of a plan whose rotations had to be shifted to mix, as its notes say).
    shifted = [int(m.group(1)) for note in schedule.notes if (m := re.match(r"rotations shifted in (\d+) blocks", note))]
    bound = shifted[0] if shifted else 1
    for k, rack in enumerate(racks):
        clear = [r for r in rack if r not in slow_nics]
        counts = [sum(len(racks_of(topo, g)) > 1 for p in schedule.period for g in p if r in g) for r in clear]
        if counts:
            assert max(counts) - min(counts) <= bound, (k, clear, counts)
    if any(len(set(r) & set(slow_nics)) > len(set(r) - set(slow_nics)) - 1 for r in racks if set(r) & set(slow_nics)):
        assert schedule.notes  # short of clear partners: the plan says what it did instead
    check_adjusted(schedule, topo, slow_uplinks=slow_uplinks, slow_nics=slow_nics)


def test_three_racks_with_a_slow_uplink_keep_the_regular_racks_meeting():
    topo = Topology.from_rack_sizes([4, 4, 4])
    static = static_plan(topo)
    assert static.rho ** (1 / len(static.period)) == pytest.approx(2 / 3)
    for slow in range(3):
        schedule = adjusted_plan(topo, slow_uplinks=[slow])
        assert schedule.rho ** (1 / len(schedule.period)) <= 0.8
        regular = set(range(3)) - {slow}
        for partition in schedule.period:
            crossing = [g for g in partition if len(racks_of(topo, g)) > 1]
            assert sum(topo.rack_of(r) == slow for g in crossing for r in g) == 1  # one flow on the slow uplink
            assert any(racks_of(topo, g) == regular for g in crossing)  # the regular racks meet directly
        check_adjusted(schedule, topo, slow_uplinks=[slow])


@pytest.mark.parametrize(("sizes", "slow_nics"), [([3, 3], [0, 1]), ([4, 4], [1, 2, 3]), ([2, 3], [0, 1]),
                                                  ([5], [0, 1, 2, 3])])
def test_more_slow_nics_than_clear_partners_still_stay_in_pairs(sizes, slow_nics):
    topo = Topology.from_rack_sizes(sizes)
    schedule = adjusted_plan(topo, slow_nics=slow_nics)
    check_adjusted(schedule, topo, slow_nics=slow_nics)
    assert schedule.notes and any("slow" in note for note in schedule.notes)
    for r in slow_nics:
        assert all(len(next(g for g in p if r in g)) <= 2 for p in schedule.period)
        # every slow worker still meets a clear one of its rack within the period, when there is one
        clear = [c for c in topo.racks()[topo.rack_of(r)] if c not in slow_nics]
        if clear:
            assert partners_of(schedule, r) & set(clear), (r, schedule.period)
    assert schedule.rho < 1


def test_fig5_slow_rack_pairs_with_a_rotating_regular_rack():
    topo = Topology.from_rack_sizes([3, 3, 3, 3])
    schedule = adjusted_plan(topo, slow_uplinks=[0])
    for partition in schedule.period:
        crossing = [g for g in partition if len({topo.rack_of(r) for r in g}) > 1]
        small = [g for g in crossing if any(topo.rack_of(r) == 0 for r in g)]
        assert len(small) == 1 and len(small[0]) == 2
        large = [g for g in crossing if g is not small[0]]
        assert len(large) == 1 and len(large[0]) == 3  # every regular rack's representative
    # The regular partner rotates through every regular rack, and every worker of rack 0 represents it.
    partner_racks = {topo.rack_of(r) for p in schedule.period for g in p
                     if len(g) == 2 and 0 in {topo.rack_of(x) for x in g} for r in g} - {0}
    assert partner_racks == {1, 2, 3}
    assert schedule.rho < 1


def test_fig6_slow_nic_pairs_with_rotating_rack_mates():
    topo = Topology.from_rack_sizes([5, 3])
    schedule = adjusted_plan(topo, slow_uplinks=[0], slow_nics=[4])
    assert partners_of(schedule, 4) == {0, 1, 2, 3}  # every regular worker of its rack in turn
    for partition in schedule.period:
        group = next(g for g in partition if 4 in g)
        assert len(group) == 2 and max(group) < 5
        # The large intra-rack group of rack 0 is what is left: 5 - pair - representative.
        assert any(len(g) == 2 and all(r < 5 for r in g) and 4 not in g for g in partition)
    check_adjusted(schedule, topo, slow_uplinks=[0], slow_nics=[4])


def test_plan_reads_the_topologys_contention():
    topo = Topology.from_rack_sizes([5, 3])
    assert plan(topo).digest() == static_plan(topo).digest()
    contended = Topology.from_dict({**topo.to_dict(), "contention": {
        "uplinks": [{"rack": 0, "bandwidth_gbps": 0.2}], "nics": [{"rank": 4, "bandwidth_gbps": 0.3}]}})
    assert plan(contended).digest() == adjusted_plan(topo, slow_uplinks=[0], slow_nics=[4]).digest()


def test_check_adjusted_catches_a_slow_nic_in_a_big_group():
    topo = Topology.from_rack_sizes([4, 4])
    with pytest.raises(ScheduleError, match="rank 1 has a slow NIC"):
        check_adjusted(static_plan(topo), topo, slow_nics=[1])


def test_bad_contention_entries_are_refused():
    topo = Topology.from_rack_sizes([2, 2])
    with pytest.raises(ScheduleError, match="slow uplink of rack 5"):
        adjusted_plan(topo, slow_uplinks=[5])
    with pytest.raises(ScheduleError, match="slow NIC of rank 9"):
        adjusted_plan(topo, slow_nics=[9])


# -- paced plans (dssync's extension) ---------------------------------------------------------
@settings(max_examples=50, deadline=None)
@given(contended_layouts(), st.integers(2, 5))
def test_a_paced_plan_crosses_racks_only_every_pace_rounds_and_still_mixes(layout, pace):
    sizes, slow_uplinks, slow_nics = layout
    topo = Topology.from_rack_sizes(sizes)
    data = topo.to_dict()
    data["contention"] = {"uplinks": [{"rack": r} for r in slow_uplinks], "nics": [{"rank": i} for i in slow_nics]}
    topo = Topology.from_dict(data)
    base = plan(topo, kind="adjusted")
    schedule = plan(topo, pace=pace, kind="adjusted")
    assert len(schedule.period) == pace * len(base.period)
    assert schedule.period[::pace] == base.period  # every round of the plan, once, in order
    for t, partition in enumerate(schedule.period):
        if t % pace == 0:
            continue
        assert sorted(r for g in partition for r in g) == list(range(topo.world_size))
        # rack-local: no group crosses racks; intra-rack groups of the round before stay
        assert all(len({topo.rack_of(r) for r in g}) == 1 for g in partition), partition
        before = {g for g in schedule.period[t - t % pace] if len({topo.rack_of(r) for r in g}) == 1}
        for g in before:
            assert any(set(g) <= set(h) for h in partition)
        for r in slow_nics:  # a slow NIC keeps its pair, never joins a larger group
            assert len(next(g for g in partition if r in g)) <= 2
    assert schedule.rho < 1
    check_paced(schedule, topo, pace)


def test_rack_local_rounds_fold_the_representatives_back_into_their_racks():
    topo = Topology.from_rack_sizes([4, 4])
    schedule = plan(topo, pace=3)
    assert schedule.period[:3] == (((0, 4), (1, 2, 3), (5, 6, 7)),
                                   ((0, 1, 2, 3), (4, 5, 6, 7)), ((0, 1, 2, 3), (4, 5, 6, 7)))
    data = Topology.from_rack_sizes([5, 3]).to_dict()
    data["contention"] = {"nics": [{"rank": 4}]}
    topo = Topology.from_dict(data)
    first, local = plan(topo, pace=2).period[:2]
    assert first == ((0, 5), (1, 4), (2, 3), (6, 7))
    assert local == ((0, 2, 3), (1, 4), (5, 6, 7))  # rank 0 joins the regular pair, not rank 4's


def test_check_paced_rejects_racks_exchanging_off_pace():
    topo = Topology.from_rack_sizes([4, 4])
    with pytest.raises(ScheduleError, match="cross racks, but with pace 2"):
        check_paced(static_plan(topo), topo, 2)
    with pytest.raises(ScheduleError, match="multiple of 3 rounds"):
        check_paced(plan(topo, pace=2), topo, 3)
    with pytest.raises(ScheduleError, match="pace must be 1"):
        plan(topo, pace=0)


# -- the planner's choice between the static and the adjusted plan ----------------------------
def _flagged(sizes, slow_uplinks, slow_nics):
    data = Topology.from_rack_sizes(sizes).to_dict()
    data["contention"] = {"uplinks": [{"rack": r} for r in slow_uplinks], "nics": [{"rank": i} for i in slow_nics]}
    return Topology.from_dict(data)


def _slow_transfers_to_mix(schedule, topo, slow_uplinks, slow_nics):
    """The oracle of ``time_to_mix``, from the whole partitions and a dense product of
    averaging matrices: each round's worst ring factor among groups through a slow link,
    averaged, over -ln of the period's second-largest eigenvalue modulus per round."""
    n = topo.world_size
    product, worst = np.eye(n), []
    for partition in schedule.period:
        step = np.zeros((n, n))
        for g in partition:
            step[np.ix_(g, g)] = 1 / len(g)
        product = step @ product
        racks = [racks_of(topo, g) for g in partition]
        worst.append(max([2 * (len(g) - 1) / len(g) for g, rk in zip(partition, racks, strict=True)
                          if len(g) > 1 and (set(g) & set(slow_nics) or (len(rk) > 1 and rk & set(slow_uplinks)))],
                         default=0.0))
    rho = sorted(np.abs(np.linalg.eigvals(product)))[-2]
    if rho < 1e-12 or not any(worst):  # exact averaging (up to rounding) in one period
        return 0.0
    return float(np.mean(worst)) / -np.log(rho ** (1 / len(schedule.period)))


@settings(max_examples=60, deadline=None)
@given(contended_layouts(max_racks=5, max_size=6))
def test_the_planner_builds_the_plan_that_mixes_sooner_around_the_slow_links(layout):
    sizes, slow_uplinks, slow_nics = layout
    topo = _flagged(sizes, slow_uplinks, slow_nics)
    try:
        adjusted = adjusted_plan(topo, slow_uplinks=slow_uplinks, slow_nics=slow_nics)
    except ScheduleError:
        assume(False)
    static = static_plan(topo)
    chosen = plan(topo)
    if not slow_uplinks and not slow_nics:
        assert chosen.period == static.period
        return
    cost_static = _slow_transfers_to_mix(static, topo, slow_uplinks, slow_nics)
    cost_adjusted = _slow_transfers_to_mix(adjusted, topo, slow_uplinks, slow_nics)
    assert time_to_mix(static, topo) == pytest.approx(cost_static, rel=1e-4, abs=1e-9)
    assert time_to_mix(adjusted, topo) == pytest.approx(cost_adjusted, rel=1e-4, abs=1e-9)
    if abs(cost_static - cost_adjusted) > 1e-3 * max(cost_static, cost_adjusted):  # rho is computed two ways
        assert chosen.period == (static if cost_static < cost_adjusted else adjusted).period
    assert plan(topo, kind="adjusted").period == adjusted.period


@pytest.mark.parametrize(("sizes", "slow_uplinks", "slow_nics", "kind"), [
    ([3, 3, 3], [0], [], "static"),      # the emulated three-rack scenario: 0.50 a round against 0.94
    ([4, 4, 4, 4], [1], [], "static"),
    ([3, 2, 3, 4], [2], [9], "adjusted"),  # four-rack: the slow NIC's pair outweighs the slower mixing
    ([8, 8], [], [3], "adjusted"),
    ([16], [], [3], "adjusted"),          # one rack: the static plan would be the world's allreduce
])
def test_the_planners_choice_on_the_emulated_layouts(sizes, slow_uplinks, slow_nics, kind):
    topo = _flagged(sizes, slow_uplinks, slow_nics)
    built, schedule = base_plan(topo)
    assert built == kind
    expected = static_plan(topo) if kind == "static" else adjusted_plan(topo, slow_uplinks=slow_uplinks,
                                                                       slow_nics=slow_nics)
    assert schedule.period == expected.period
    assert any("not the adjusted one" in note for note in schedule.notes) == (kind == "static")
    if kind == "static":
        check_static(schedule, topo)
    with pytest.raises(ScheduleError, match="plan kind must be one of auto, adjusted"):
        plan(topo, kind="static")
