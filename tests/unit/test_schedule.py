import json

import numpy as np
import pytest

from dssync.errors import ScheduleError
from dssync.planning.planner import static_plan
from dssync.planning.schedule import Schedule, averaging_matrix, mixing_rho
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
@pytest.mark.parametrize("dense_groups_max", [1024, 1])
def test_rho_from_the_chain_of_groups_equals_the_dense_product(sizes, dense_groups_max, monkeypatch):
    """The compact schedule's rho (group chain; ARPACK on it when forced with a bound of
    one group) against the n x n product of the whole partitions (``mixing_rho``)."""
    from dssync.planning import schedule as schedule_module
    from dssync.planning.planner import adjusted_plan

    monkeypatch.setattr(schedule_module, "DENSE_GROUPS_MAX", dense_groups_max)
    topo = Topology.from_rack_sizes(sizes)
    for schedule in (static_plan(topo), adjusted_plan(topo, slow_uplinks=[0], slow_nics=[1])):
        n = schedule.world_size
        assert schedule.rho == pytest.approx(mixing_rho(schedule.period, n), abs=1e-7)


def _random_compact(seed):
    """Random blocks, and rounds that name random disjoint groups (some crossing blocks)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 24))
    cuts = sorted(rng.choice(np.arange(1, n), size=int(rng.integers(0, min(5, n - 1) + 1)), replace=False))
    order = rng.permutation(n)
    blocks = [sorted(int(r) for r in part) for part in np.split(order, cuts) if len(part)]
    rounds = []
    for _ in range(int(rng.integers(1, 6))):
        chosen = rng.permutation(n)[:int(rng.integers(0, n + 1))]
        split = sorted(rng.choice(np.arange(1, len(chosen)), size=min(len(chosen) - 1, int(rng.integers(0, 4))),
                                  replace=False)) if len(chosen) > 1 else []
        rounds.append([sorted(int(r) for r in g) for g in np.split(chosen, split) if len(g)])
    return n, blocks, rounds


@pytest.mark.parametrize("seed", range(60))
def test_compact_schedules_match_their_whole_partitions(seed):
    """On random blocks and named groups: the partitions the compact form stands for are
    partitions; rho, mixing and group_of agree with the dense definition computed from
    them; the file round trip keeps every partition and the digest."""
    from dssync.planning.schedule import connected

    n, blocks, rounds = _random_compact(seed)
    period = []
    for named in rounds:
        listed = {r for g in named for r in g}
        rests = [tuple(r for r in b if r not in listed) for b in blocks]
        period.append(sorted([tuple(g) for g in named] + [g for g in rests if g]))
    dense = mixing_rho(period, n)
    assert connected(n, blocks, rounds) == (dense < 1 - 1e-9)
    if dense >= 1 - 1e-9:
        with pytest.raises(ScheduleError, match="does not mix"):
            Schedule(world_size=n, blocks=blocks, rounds=rounds)
        return
    compact = Schedule(world_size=n, blocks=blocks, rounds=rounds)
    whole = Schedule(world_size=n, period=period)
    assert compact.rho == pytest.approx(dense, abs=1e-7)
    assert [list(p) for p in compact.period] == [list(p) for p in whole.period]
    for step in range(2 * len(period)):
        for rank in range(n):
            group = compact.group_of(rank, step)
            assert rank in group and group in period[step % len(period)]
    assert compact.digest() == whole.digest()
    assert compact.distinct_groups() == whole.distinct_groups()


def test_large_schedules_are_written_compact_and_read_back(tmp_path, monkeypatch):
    from dssync.planning import schedule as schedule_module

    monkeypatch.setattr(schedule_module, "EXPLICIT_MAX", 10)
    topo = Topology.from_rack_sizes([4, 3, 5])
    schedule = static_plan(topo)
    schedule.save(tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["version"] == 2 and data["blocks"] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9, 10, 11]]
    assert all(len(r) == 1 and len(r[0]) == 3 for r in data["rounds"])  # only the inter-rack group is named
    back = Schedule.load(tmp_path / "s.json")
    assert back.period == schedule.period and back.digest() == schedule.digest() and back.rho == schedule.rho


@pytest.mark.parametrize(("blocks", "rounds", "match"), [
    ([[0, 1], [2]], [[[0, 2]]], r"the blocks are not a partition of ranks 0..3: missing ranks \[3\]"),
    ([[0, 1], [1, 2, 3]], [[[0, 2]]], r"ranks in two groups \[1\]"),
    ([[0, 1], [2, 3]], [[[0, 2], [2, 3]]], r"round 0 is not a partition of ranks 0..3: ranks in two groups \[2\]"),
    ([[0, 1], [2, 3]], [[[0, 7]]], r"ranks out of range \[7\]"),
    ([[0, 1], [2, 3]], [[[0, 1]]], "does not mix"),
    ([[0, 1], [2, 3]], [[[0, "x"]]], "must hold integer ranks"),
    ([[0, 1], [2, 3]], [], "empty"),
])
def test_malformed_compact_files(tmp_path, blocks, rounds, match):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"version": 2, "world_size": 4, "blocks": blocks, "rounds": rounds}))
    with pytest.raises(ScheduleError, match=match):
        Schedule.load(path)


def test_notes_survive_the_file_and_malformed_ones_are_refused():
    schedule = Schedule(world_size=2, period=(((0, 1),),), notes=("rack 0: a reason",))
    assert Schedule.from_dict(schedule.to_dict()).notes == ("rack 0: a reason",)
    assert "notes" not in Schedule(world_size=2, period=(((0, 1),),)).to_dict()
    with pytest.raises(ScheduleError, match='"notes" must be a list of sentences'):
        Schedule.from_dict({**schedule.to_dict(), "notes": "one string"})


def test_a_huge_declared_world_size_is_refused_without_building_it():
    with pytest.raises(ScheduleError, match="missing ranks 999999999997 of 1000000000000"):
        Schedule(world_size=10**12, period=(((0, 1), (5,)),))
