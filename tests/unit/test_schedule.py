import json

import numpy as np
import pytest

from dssync.errors import ScheduleError
from dssync.planner import static_plan
from dssync.schedule import Schedule, averaging_matrix, mixing_rho
from dssync.topology import Topology

PERIOD = [[[0, 4], [1, 2, 3], [5, 6, 7]], [[1, 5], [0, 2, 3], [4, 6, 7]],
          [[2, 6], [0, 1, 3], [4, 5, 7]], [[3, 7], [0, 1, 2], [4, 5, 6]]]


def test_roundtrip_and_queries(tmp_path):
    s = Schedule(world_size=8, period=tuple(tuple(tuple(g) for g in p) for p in PERIOD))
    path = tmp_path / "s.json"
    s.save(path)
    back = Schedule.load(path)
    assert back.to_dict() == s.to_dict()
    assert back.digest() == s.digest()
    assert back.group_of(5, 0) == (5, 6, 7)
    assert back.group_of(5, 5) == (1, 5)  # step 5 uses round 1
    assert (0, 4) in back.distinct_groups() and len(back.distinct_groups()) == 12
    assert 0 < back.rho < 1


def test_rho_matches_a_plain_computation():
    # Oracle: multiply the averaging matrices by hand and take the eigenvalues with numpy.
    n = 8
    prod = np.eye(n)
    for part in PERIOD:
        w = np.zeros((n, n))
        for g in part:
            for i in g:
                for j in g:
                    w[i, j] = 1 / len(g)
        prod = w @ prod
    expected = sorted(np.abs(np.linalg.eigvals(prod)))[-2]
    assert mixing_rho(PERIOD, n) == pytest.approx(expected, abs=1e-12)
    assert averaging_matrix([[0, 1], [2]], 3).sum(axis=0) == pytest.approx([1, 1, 1])


def test_a_period_that_never_mixes_is_rejected():
    # Racks {0,1} and {2,3} never exchange anything: rho == 1.
    with pytest.raises(ScheduleError, match="does not mix"):
        Schedule(world_size=4, period=(((0, 1), (2, 3)),))


@pytest.mark.parametrize(("period", "match"), [
    ([[[0, 1], [1, 2, 3]]], r"ranks in two groups \[1\]"),
    ([[[0, 1], [2]]], r"missing ranks \[3\]"),
    ([[[0, 1, 2, 3, 4]]], r"out of range \[4\]"),
    ([[[0, 1, 2, 3], []]], "empty group"),
    ([], "empty"),
])
def test_malformed_partitions(tmp_path, period, match):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"version": 1, "world_size": 4, "period": period}))
    with pytest.raises(ScheduleError, match=match):
        Schedule.load(path)


def test_file_errors(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"version": 1, "world_size": 4, "period": "x"}))
    with pytest.raises(ScheduleError, match="list of rounds"):
        Schedule.load(path)
    path.write_text(json.dumps({"version": 1, "world_size": 4, "period": [[[0, 1, 2, 3]]], "rho": 0.5}))
    with pytest.raises(ScheduleError, match="rho"):
        Schedule.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(ScheduleError, match="JSON object"):
        Schedule.load(path)


@pytest.mark.parametrize("sizes", [[4, 4], [5, 3], [3, 2, 4], [8] * 8, [16] * 16, [2] * 40])
def test_rho_without_the_dense_product_equals_the_dense_one(sizes):
    from dssync.planner import adjusted_plan
    from dssync.schedule import _mixing_rho_sparse

    topo = Topology.from_rack_sizes(sizes)
    for schedule in (static_plan(topo), adjusted_plan(topo, slow_uplinks=[0], slow_nics=[1])):
        n = schedule.world_size
        assert _mixing_rho_sparse(schedule.period, n) == pytest.approx(mixing_rho(schedule.period, n), abs=1e-7)


def test_notes_survive_the_file_and_malformed_ones_are_refused():
    schedule = Schedule(world_size=2, period=(((0, 1),),), notes=("rack 0: a reason",))
    assert Schedule.from_dict(schedule.to_dict()).notes == ("rack 0: a reason",)
    assert "notes" not in Schedule(world_size=2, period=(((0, 1),),)).to_dict()
    with pytest.raises(ScheduleError, match='"notes" must be a list of sentences'):
        Schedule.from_dict({**schedule.to_dict(), "notes": "one string"})


def test_a_huge_declared_world_size_is_refused_without_building_it():
    with pytest.raises(ScheduleError, match="missing ranks 999999999997 of 1000000000000"):
        Schedule(world_size=10**12, period=(((0, 1), (5,)),))
