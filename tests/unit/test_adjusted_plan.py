"""adjustGroups (paper Fig. 5 and 6): contended uplinks and NICs kept in groups of two."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dssync.errors import ScheduleError
from dssync.planner import adjusted_plan, check_adjusted, check_paced, plan, static_plan
from dssync.topology import Topology


@st.composite
def contended_layouts(draw):
    """Rack sizes, slow uplinks (at least one rack left clear) and slow NICs that fit."""
    sizes = draw(st.lists(st.integers(min_value=1, max_value=7), min_size=2, max_size=6))
    racks = len(sizes)
    slow_uplinks = draw(st.lists(st.integers(0, racks - 1), unique=True, max_size=racks - 1))
    slow_nics, first = [], 0
    for size in sizes:
        # A rack can pair up to size - 2 slow workers: one regular represents it, one per pair.
        k = draw(st.integers(0, max(0, (size - 1) // 2)))
        slow_nics += draw(st.lists(st.integers(first, first + size - 1), unique=True,
                                   min_size=k, max_size=k))
        first += size
    return sizes, sorted(slow_uplinks), sorted(slow_nics)


def partners_of(schedule, rank):
    return {next(r for r in g if r != rank) for p in schedule.period for g in p if rank in g and len(g) == 2}


@settings(max_examples=300, deadline=None)
@given(contended_layouts())
def test_contended_links_are_in_pairs_every_round_and_the_plan_mixes(layout):
    sizes, slow_uplinks, slow_nics = layout
    topo = Topology.from_rack_sizes(sizes)
    schedule = adjusted_plan(topo, slow_uplinks=slow_uplinks, slow_nics=slow_nics)
    n = topo.world_size
    for partition in schedule.period:
        assert sorted(r for g in partition for r in g) == list(range(n))
        for group in partition:
            crossing = len({topo.rack_of(r) for r in group}) > 1
            for r in group:
                if r in slow_nics:  # a slow NIC: a pair inside its rack, every round
                    assert len(group) == 2 and not crossing, (r, partition)
                if crossing and topo.rack_of(r) in slow_uplinks:  # a slow uplink: only pairs cross it
                    assert len(group) == 2, (r, partition)
        # A slow rack whose representative crosses at all does so with a regular rack.
        for group in partition:
            racks_in = {topo.rack_of(r) for r in group}
            if len(racks_in) == 2 and racks_in & set(slow_uplinks) and len(slow_uplinks) < len(sizes) / 2:
                assert racks_in - set(slow_uplinks)
    assert schedule.rho < 1
    check_adjusted(schedule, topo, slow_uplinks=slow_uplinks, slow_nics=slow_nics)


def test_fig5_slow_rack_pairs_with_a_rotating_regular_rack():
    topo = Topology.from_rack_sizes([3, 3, 3, 3])
    schedule = adjusted_plan(topo, slow_uplinks=[0])
    for partition in schedule.period:
        crossing = [g for g in partition if len({topo.rack_of(r) for r in g}) > 1]
        small = [g for g in crossing if any(topo.rack_of(r) == 0 for r in g)]
        assert len(small) == 1 and len(small[0]) == 2
        large = [g for g in crossing if g is not small[0]]
        assert len(large) == 1 and len(large[0]) == 2  # the other two regular representatives
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
@settings(max_examples=200, deadline=None)
@given(contended_layouts(), st.integers(2, 5))
def test_a_paced_plan_crosses_racks_only_every_pace_rounds_and_still_mixes(layout, pace):
    sizes, slow_uplinks, slow_nics = layout
    topo = Topology.from_rack_sizes(sizes)
    data = topo.to_dict()
    data["contention"] = {"uplinks": [{"rack": r} for r in slow_uplinks], "nics": [{"rank": i} for i in slow_nics]}
    topo = Topology.from_dict(data)
    base = plan(topo)
    schedule = plan(topo, pace=pace)
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
