"""Properties of the static divide-and-shuffle plan over random rack layouts."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dssync.errors import ScheduleError
from dssync.planner import check_static, predict_round_ms, static_plan
from dssync.schedule import Schedule
from dssync.topology import Topology

rack_layouts = st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(rack_layouts)
def test_static_plan_properties(sizes):
    topo = Topology.from_rack_sizes(sizes)
    schedule = static_plan(topo)
    n = topo.world_size
    racks = topo.racks()
    represented = [set() for _ in racks]
    for partition in schedule.period:
        # Every round is a partition of all ranks.
        assert sorted(r for g in partition for r in g) == list(range(n))
        crossing = [g for g in partition if len({topo.rack_of(r) for r in g}) > 1]
        if len(racks) == 1:
            assert crossing == [] and partition == (tuple(range(n)),)
            continue
        # Exactly one cross-rack group, with one representative per rack.
        assert len(crossing) == 1
        assert sorted(topo.rack_of(r) for r in crossing[0]) == list(range(len(racks)))
        for r in crossing[0]:
            represented[topo.rack_of(r)].add(r)
    if len(racks) > 1:
        # Every worker of every rack is representative within the period.
        assert represented == [set(r) for r in racks]
    assert schedule.rho < 1
    check_static(schedule, topo)  # the checker agrees with the properties above


def test_fig4_two_racks_of_four():
    schedule = static_plan(Topology.from_rack_sizes([4, 4]))
    assert [list(map(list, p)) for p in schedule.period] == [
        [[0, 4], [1, 2, 3], [5, 6, 7]],
        [[0, 2, 3], [1, 5], [4, 6, 7]],
        [[0, 1, 3], [2, 6], [4, 5, 7]],
        [[0, 1, 2], [3, 7], [4, 5, 6]],
    ]


def test_unequal_racks_use_lcm_or_bounded_rotation():
    assert len(static_plan(Topology.from_rack_sizes([5, 3])).period) == 15
    big = Topology.from_rack_sizes([7, 8, 9])  # lcm 504 > 64: bounded rotation of 72 rounds (8 x 9)
    schedule = static_plan(big)
    assert len(schedule.period) == 72 and "bounded period of 72 rounds" in schedule.notes[0]
    check_static(schedule, big)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=12), min_size=2, max_size=6))
def test_every_worker_represents_its_rack_equally_often_within_one(sizes):
    topo = Topology.from_rack_sizes(sizes)
    schedule = static_plan(topo)
    for rack in topo.racks():
        counts = [sum(len({topo.rack_of(x) for x in g}) > 1 for p in schedule.period for g in p if r in g)
                  for r in rack]
        assert max(counts) - min(counts) <= (0 if len(schedule.period) % len(rack) == 0 else 1), (rack, counts)
        assert min(counts) >= 1


def test_racks_of_two_still_mix():
    # Lock-step rotation would pair 0-2 and 1-3 forever; the plan shifts rack 1's rotation.
    schedule = static_plan(Topology.from_rack_sizes([2, 2]))
    assert [list(map(list, p)) for p in schedule.period] == [
        [[0, 2], [1], [3]], [[0], [1, 3], [2]], [[0, 3], [1], [2]], [[0], [1, 2], [3]]]
    assert schedule.rho < 1


def test_check_static_rejects_two_crossing_groups():
    topo = Topology.from_rack_sizes([2, 2])
    bad = Schedule(world_size=4, period=(((0, 2), (1, 3)), ((0, 1, 2, 3),)))
    with pytest.raises(ScheduleError, match="2 groups that cross racks"):
        check_static(bad, topo)


def test_check_static_rejects_a_rank_that_never_represents():
    topo = Topology.from_rack_sizes([3, 3])
    # Mixes (union graph connected) but rank 2 never represents rack 0.
    fixed_rep = Schedule(world_size=6, period=(((0, 3), (1, 2), (4, 5)), ((0, 2), (1, 4), (3, 5))))
    with pytest.raises(ScheduleError, match=r"rack 0: ranks \[2\] never represent"):
        check_static(fixed_rep, topo)


def test_predicted_round_time_is_the_slowest_groups_lower_bound():
    import numpy as np

    n = 4
    bw = np.full((n, n), 1.0)
    bw[0, 2] = bw[2, 0] = 0.25  # slow cross-rack link between the first representatives
    topo = Topology(workers=Topology.from_rack_sizes([2, 2]).workers, bandwidth_gbps=bw)
    partition = ((0, 2), (1,), (3,))
    # 2(n-1)/n * S / B with n=2, S=1e6 B, B=0.25 Gbit/s -> 32 ms
    assert predict_round_ms(partition, topo, 1_000_000) == pytest.approx(32.0)
