"""Real multi-process gloo worlds, compared against plain oracles computed here."""

import pytest
import torch
from ranks import (
    baseline_gradients,
    die_on_rank,
    die_while_the_others_wait_at_a_barrier,
    group_averaging,
    late_to_barriers,
    raise_on_rank,
    seeded_vector,
    straggle_in_group,
    two_schedules,
)

from dssync.errors import DssyncError
from dssync.launch import run_ranks
from dssync.planning.planner import static_plan
from dssync.topology import Topology

pytestmark = pytest.mark.dist

NUMEL = 33
NUM_PERIODS = 40


@pytest.mark.parametrize(("world_size", "layouts"), [
    (4, [[2, 2], [1, 3]]),
    (8, [[4, 4], [5, 3]]),
])
def test_group_averaging_matches_oracle_and_reaches_global_mean(world_size, layouts):
    out = run_ranks(group_averaging, layouts, NUMEL, NUM_PERIODS, nproc=world_size, timeout_s=120)
    initial = [seeded_vector(r, NUMEL) for r in range(world_size)]
    global_mean = torch.stack(initial).mean(0)
    for sizes in layouts:
        schedule = static_plan(Topology.from_rack_sizes(sizes))
        # Oracle: the mean of the explicitly seeded tensors over each group, step by step.
        state = [v.clone() for v in initial]
        for step in range(NUM_PERIODS * len(schedule.period)):
            for group in schedule.partition_at(step):
                mean = torch.stack([state[r] for r in group]).mean(0)
                for r in group:
                    state[r] = mean.clone()
            for r in range(world_size):
                torch.testing.assert_close(out[r][tuple(sizes)][step], state[r], rtol=1e-12, atol=1e-12)
        # With no gradient, repeated periods drive every rank to the global mean.
        for r in range(world_size):
            final = out[r][tuple(sizes)][-1]
            torch.testing.assert_close(final, global_mean, rtol=0, atol=1e-9)
        spread = max(float((out[r][tuple(sizes)][0] - global_mean).abs().max())
                     for r in range(world_size))
        assert spread > 1e-3  # one round alone does not reach it: the check can tell


def test_bsp_allreduce_gradients_equal_the_mean():
    out = run_ranks(baseline_gradients, "allreduce", [2, 2], NUMEL, nproc=4, timeout_s=60)
    expected = torch.stack([seeded_vector(r, NUMEL) for r in range(4)]).mean(0)
    for grads in out:
        torch.testing.assert_close(grads, expected, rtol=1e-12, atol=1e-12)


def test_a_failing_rank_stops_the_job_with_its_rank():
    with pytest.raises(DssyncError, match="rank 2: deliberate failure"):
        run_ranks(raise_on_rank, 2, nproc=4, timeout_s=30, job_timeout_s=120)


def test_a_dead_peer_is_reported_not_waited_on_forever():
    with pytest.raises(DssyncError, match=r"rank \d"):
        run_ranks(die_on_rank, 1, nproc=3, timeout_s=15, job_timeout_s=120)


def test_a_wait_past_the_timeout_names_rank_and_group():
    with pytest.raises(DssyncError, match=r"rank 0: allreduce over group \[0, 1\] \(timeout 3 s\) failed"):
        run_ranks(straggle_in_group, 12.0, nproc=3, timeout_s=3, job_timeout_s=120)


def test_a_barrier_lets_no_rank_leave_before_the_last_arrives():
    # The latecomer differs each time, rank 0 (who collects the arrivals) among them, and
    # the barriers follow each other at once, so one barrier's tokens cannot serve the next.
    lateness = [{2: 1.0}, {0: 1.0}, {}, {3: 0.5, 1: 1.0}]
    out = run_ranks(late_to_barriers, lateness, nproc=4, timeout_s=30)
    for i, late in enumerate(lateness):
        last = max(out[r][i][0] for r in range(4))  # monotonic clocks of one machine
        assert all(out[r][i][1] >= last for r in range(4)), (i, [out[r][i] for r in range(4)])
        if late:
            latest = max(late, key=late.get)
            assert out[latest][i][0] == last, (i, late, [out[r][i] for r in range(4)])


def test_a_barrier_a_rank_never_reaches_names_that_rank():
    with pytest.raises(DssyncError, match=r"rank 0: barrier over the world \(timeout 3 s\) failed: "
                                          r"rank 1 did not arrive"):
        run_ranks(late_to_barriers, [{1: 10.0}], nproc=2, timeout_s=3, job_timeout_s=120)


def test_a_rank_dead_at_a_barrier_is_named_once(capfd):
    # The job's error is its one report: torch's monitored barrier also logged it from C++.
    with pytest.raises(DssyncError, match=r"rank 1 died \(exit code 3\)"):
        run_ranks(die_while_the_others_wait_at_a_barrier, 1, nproc=3, timeout_s=30, job_timeout_s=120)
    err = capfd.readouterr().err
    assert "ProcessGroupGloo" not in err and "monitoredBarrier" not in err, err


def test_ranks_that_disagree_on_the_schedule_are_stopped():
    with pytest.raises(DssyncError, match="ranks hold different schedules"):
        run_ranks(two_schedules, nproc=4, timeout_s=30, job_timeout_s=120)


def test_every_job_s_ranks_start_with_the_job_s_environment_directory_and_stderr_as_they_are_now(
        tmp_path, monkeypatch, capfd):
    """Ranks are forked by a fork server that lives as long as this process, started under the
    first job's settings: a later job's ranks must still see that job's own."""
    from ranks import what_the_rank_sees

    for k, value in enumerate(("first", "second")):
        where = tmp_path / value
        where.mkdir()
        monkeypatch.chdir(where)
        monkeypatch.setenv("DSSYNC_TEST_VALUE", value)
        seen = run_ranks(what_the_rank_sees, "DSSYNC_TEST_VALUE", nproc=2, timeout_s=30, job_timeout_s=120)
        assert seen == [(value, str(where))] * 2
        err = capfd.readouterr().err
        assert sorted(line for line in err.splitlines() if "writes here" in line) == \
            ["rank 0 writes here", "rank 1 writes here"], (k, err)
    monkeypatch.delenv("DSSYNC_TEST_VALUE")
    assert run_ranks(what_the_rank_sees, "DSSYNC_TEST_VALUE", nproc=2, timeout_s=30)[0][0] is None
