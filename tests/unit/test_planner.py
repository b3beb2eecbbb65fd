"""Properties of the static divide-and-shuffle plan over random rack layouts."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dssync.errors import ScheduleError
from dssync.planning.planner import check_static, predict_round_ms, static_plan
from dssync.planning.schedule import Schedule
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


contended_layouts = st.tuples(
    st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=6),
    st.data(),
)


@settings(max_examples=150, deadline=None)
@given(contended_layouts)
def test_the_checks_read_a_compact_plan_as_its_whole_partitions(layout):
    """A plan (racks as blocks, only the cross-rack groups and pairs named) and the same
    partitions given whole pass the same checks: the checks of the compact form, which look
    at a rack's rest only through its slow NICs, miss nothing the whole partitions show."""
    from dssync.planning.planner import adjusted_plan, check_adjusted

    sizes, data = layout
    topo = Topology.from_rack_sizes(sizes)
    n = topo.world_size
    uplinks = data.draw(st.lists(st.integers(0, len(sizes) - 1), unique=True, max_size=len(sizes)))
    nics = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=max(1, n // 3)))
    try:
        schedule = adjusted_plan(topo, slow_uplinks=uplinks, slow_nics=nics)
    except ScheduleError:
        return  # no mixing plan for this contention: said so, nothing to check
    assert schedule.blocks == tuple(tuple(r) for r in topo.racks())
    whole = Schedule(world_size=n, period=schedule.period)
    assert whole.rho == pytest.approx(schedule.rho, abs=1e-7)
    check_adjusted(schedule, topo, slow_uplinks=uplinks, slow_nics=nics)
    check_adjusted(whole, topo, slow_uplinks=uplinks, slow_nics=nics)
    named = sum(len(g) for r in schedule.rounds for g in r)
    assert named <= schedule.length * (len(sizes) + 2 * len(nics) + 2 * len(uplinks) + 2)


def test_check_adjusted_finds_a_slow_nic_left_in_a_racks_rest():
    from dssync.planning.planner import check_adjusted

    topo = Topology.from_rack_sizes([4, 4])
    # Rank 1 (slow NIC) is named nowhere: it sits in rack 0's rest {1, 2, 3}, a group of three.
    schedule = Schedule(world_size=8, blocks=topo.racks(), rounds=[[(0, 4)], [(1, 5)], [(2, 6)], [(3, 7)]])
    with pytest.raises(ScheduleError, match=r"round 0: rank 1 has a slow NIC but is in"):
        check_adjusted(schedule, topo, slow_nics=[1])
    check_static(schedule, topo)


@pytest.mark.parametrize(("racks", "per_rack"), [(2, 5000), (1000, 100), (100000, 1)])
def test_a_large_plan_names_about_one_rank_per_rack_a_round(racks, per_rack):
    """Planning holds the racks once and, per round, the inter-rack group: never period x n
    (10,000 in two racks: 5,000 rounds; 100,000 single-worker racks: one group)."""
    topo = Topology.from_rack_sizes([per_rack] * racks)
    schedule = static_plan(topo)
    assert schedule.length == max(1, per_rack if racks > 1 else 1)
    assert sum(len(g) for r in schedule.rounds for g in r) <= schedule.length * racks
    assert 0 <= schedule.rho < 1
    assert schedule.to_dict()["version"] == (2 if schedule.length * topo.world_size > 2**20 else 1)
