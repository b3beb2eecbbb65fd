"""Strategy logic on the in-process fake world (threads, real reductions)."""

import pytest
import torch
from torch import nn

from dssync.collectives import FakeWorld
from dssync.errors import CommunicationError, ScheduleError
from dssync.planning.planner import plan, static_plan
from dssync.planning.schedule import Schedule
from dssync.strategies import AllreduceStrategy, DSSyncStrategy, get_strategy
from dssync.strategies.base import StrategyContext
from dssync.topology import Topology


def _seeded_linear(rank: int) -> nn.Linear:
    # A private generator: ranks are threads here, and the global RNG is shared by them.
    gen = torch.Generator().manual_seed(100 + rank)
    model = nn.Linear(3, 2, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def test_ds_sync_round_averages_within_groups_only():
    topo = Topology.from_rack_sizes([2, 2])
    schedule = static_plan(topo)
    initial = [torch.nn.utils.parameters_to_vector(_seeded_linear(r).parameters()) for r in range(4)]

    def body(comm):
        model = _seeded_linear(comm.rank)
        strategy = DSSyncStrategy(StrategyContext(comm=comm, model=model, topology=topo))
        comm.register_groups(schedule.distinct_groups())  # setup() would broadcast rank 0's init
        strategy.after_step(0)
        return torch.nn.utils.parameters_to_vector(model.parameters())

    out = FakeWorld(4).run(body)
    for group in schedule.partition_at(0):
        expected = torch.stack([initial[r] for r in group]).mean(0)
        for r in group:
            torch.testing.assert_close(out[r], expected)


def test_ds_sync_averages_the_whole_world_every_world_every_iterations():
    topo = Topology.from_rack_sizes([2, 3])
    schedule = static_plan(topo)
    initial = [torch.nn.utils.parameters_to_vector(_seeded_linear(r).parameters()) for r in range(5)]

    def body(comm):
        model = _seeded_linear(comm.rank)
        strategy = DSSyncStrategy(StrategyContext(comm=comm, model=model, topology=topo),
                                  DSSyncStrategy.Config(world_every=3))
        comm.register_groups(schedule.distinct_groups())
        vectors = []
        for step in range(3):
            strategy.after_step(step)
            vectors.append(torch.nn.utils.parameters_to_vector(model.parameters()).clone())
        return vectors

    out = FakeWorld(5).run(body)
    # iterations 0 and 1: the plan's groups, as without the option
    after = [v.clone() for v in initial]
    for step in range(2):
        for group in schedule.partition_at(step):
            mean = torch.stack([after[r] for r in group]).mean(0)
            for r in group:
                after[r] = mean
        for r in range(5):
            torch.testing.assert_close(out[r][step], after[r])
    assert not all(torch.allclose(after[0], after[r]) for r in range(1, 5))
    # iteration 2 (the third): every rank holds the mean of all five
    world = torch.stack(after).mean(0)
    for r in range(5):
        torch.testing.assert_close(out[r][2], world)


def test_ds_sync_averages_the_whole_world_for_the_first_fraction_of_the_run_then_follows_the_plan():
    topo = Topology.from_rack_sizes([2, 3])
    schedule = static_plan(topo)
    initial = [torch.nn.utils.parameters_to_vector(_seeded_linear(r).parameters()) for r in range(5)]
    perturb = [torch.full_like(initial[0], float(r)) for r in range(5)]  # each rank's own "SGD step"

    def body(comm):
        model = _seeded_linear(comm.rank)
        strategy = DSSyncStrategy(StrategyContext(comm=comm, model=model, topology=topo, steps=10),
                                  DSSyncStrategy.Config(world_first=0.2))  # ceil(0.2 * 10) = 2 iterations
        comm.register_groups(schedule.distinct_groups())
        vectors = []
        for step in range(4):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(float(comm.rank))
            strategy.after_step(step)
            vectors.append(torch.nn.utils.parameters_to_vector(model.parameters()).clone())
        return vectors

    out = FakeWorld(5).run(body)
    after = [v.clone() for v in initial]
    for step in range(4):
        after = [a + d for a, d in zip(after, perturb, strict=True)]
        groups = [tuple(range(5))] if step < 2 else schedule.partition_at(step)
        for group in groups:
            mean = torch.stack([after[r] for r in group]).mean(0)
            for r in group:
                after[r] = mean
        for r in range(5):
            torch.testing.assert_close(out[r][step], after[r])
    assert not all(torch.allclose(after[0], after[r]) for r in range(1, 5))  # the plan's groups by the end


@pytest.mark.parametrize("bad", [-0.1, 1.0])
def test_ds_sync_refuses_a_world_first_that_is_no_fraction_of_the_run(bad):
    with pytest.raises(ValueError, match="world_first must be a fraction"):
        DSSyncStrategy.Config(world_first=bad)


@pytest.mark.parametrize("ensemble", ["none", "ema", "swa"])
def test_ds_sync_final_model_is_the_global_mean_of_the_ensemble_models(ensemble):
    """none: the current parameters; ema: the EMA models (one iterate, the own init here);
    swa: the plain average until the ensemble holds an iterate, then the SWA models."""
    topo = Topology.from_rack_sizes([2, 2])

    def body(comm):
        model = _seeded_linear(comm.rank)
        start = torch.nn.utils.parameters_to_vector(model.parameters()).clone()
        strategy = DSSyncStrategy(StrategyContext(comm=comm, model=model, topology=topo, steps=4),
                                  DSSyncStrategy.Config(ensemble=ensemble, swa_start=0.5))
        if ensemble == "ema":
            strategy.swa_model.update_parameters(model)  # the EMA starts at this rank's own init
        before = torch.nn.utils.parameters_to_vector(strategy.final_model().parameters())
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        strategy.averager.ensemble.fold(1)  # before swa_start (iteration 2 of 4): not taken in
        strategy.averager.ensemble.fold(2)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(2.0)
        strategy.averager.ensemble.fold(3)
        after = torch.nn.utils.parameters_to_vector(strategy.final_model().parameters())
        return start, before, after

    out = FakeWorld(4).run(body)
    mean = torch.stack([start for start, _, _ in out]).mean(0)
    want_after = {"none": mean + 3.0, "ema": None, "swa": mean + 2.0}[ensemble]  # swa: (+1, +3) averaged
    for _, before, after in out:
        torch.testing.assert_close(before, mean)
        if want_after is not None:
            torch.testing.assert_close(after, want_after)


@pytest.mark.parametrize("decay", [0.0, 0.5, 0.98])
def test_ds_sync_swa_model_is_the_bias_corrected_ema_of_the_iterates(decay):
    from torch.optim.swa_utils import AveragedModel

    from dssync.averaging.ensemble import debiased_ema

    model = torch.nn.Linear(3, 2)
    swa = AveragedModel(model, multi_avg_fn=debiased_ema(decay), use_buffers=True)
    iterates = []
    for t in range(12):
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * (t + 1))
        iterates.append(torch.nn.utils.parameters_to_vector(model.parameters()).clone())
        swa.update_parameters(model)
        weights = torch.tensor([decay ** (t - i) for i in range(t + 1)], dtype=torch.float64)
        oracle = (weights[:, None] * torch.stack(iterates).double()).sum(0) / weights.sum()
        torch.testing.assert_close(torch.nn.utils.parameters_to_vector(swa.module.parameters()), oracle.float())


def test_allreduce_averages_gradients():
    topo = Topology.from_rack_sizes([3])

    def body(comm):
        model = _seeded_linear(0)
        strategy = AllreduceStrategy(StrategyContext(comm=comm, model=model, topology=topo))
        for p in model.parameters():
            p.grad = torch.full_like(p, float(comm.rank + 1))
        strategy.before_step(0)
        return [p.grad.clone() for p in model.parameters()]

    for grads in FakeWorld(3).run(body):
        for g in grads:
            torch.testing.assert_close(g, torch.full_like(g, 2.0))  # mean of 1, 2, 3


def test_ranks_with_different_schedules_are_stopped():
    topo = Topology.from_rack_sizes([2, 2])
    a = static_plan(topo)
    b = Schedule(world_size=4, period=(((0, 1, 2, 3),),))

    def body(comm):
        schedule = a if comm.rank != 3 else b
        strategy = DSSyncStrategy(StrategyContext(comm=comm, model=_seeded_linear(0), topology=topo,
                                                  schedule=schedule))
        strategy.setup()

    with pytest.raises(ScheduleError, match="ranks hold different schedules"):
        FakeWorld(4).run(body)


def test_unregistered_group_is_an_error_not_a_hang():
    def body(comm):
        if comm.rank in (0, 1):
            comm.allreduce_(torch.ones(2), (0, 1))

    with pytest.raises(CommunicationError, match=r"group \[0, 1\] was never registered"):
        FakeWorld(4).run(body)


def test_missing_peer_times_out_naming_rank_and_group():
    def body(comm):
        comm.register_groups([(0, 1)])
        if comm.rank == 0:
            comm.allreduce_(torch.ones(2), (0, 1))  # rank 1 never joins

    with pytest.raises(CommunicationError, match=r"rank 0: allreduce over group \[0, 1\].*ranks \[1\]"):
        FakeWorld(2, timeout_s=0.5).run(body)


def test_registry_lists_names_on_a_miss():
    assert get_strategy("ds-sync") is DSSyncStrategy
    with pytest.raises(ValueError, match="choose one of: allreduce, asp, ddp, diloco, ds-sync, gossip, hierarchical, local-sgd, psp, specsync, ssp, sync-switch, torch-hier"):
        get_strategy("dssync")


def test_schedule_for_another_world_size_is_rejected():
    def body(comm):
        DSSyncStrategy(StrategyContext(comm=comm, model=_seeded_linear(0),
                                       topology=Topology.from_rack_sizes([1, 1]),
                                       schedule=static_plan(Topology.from_rack_sizes([2, 2]))))

    with pytest.raises(ScheduleError, match="schedule is for 4 ranks but this job has 2"):
        FakeWorld(2).run(body)


def _timed_records(rank, schedule, steps, slow_rank, start=0):
    """``rank``'s records on a network with ``slow_rank``'s NIC at a quarter of the rate."""
    out = []
    for step in range(start, start + steps):
        group = schedule.group_of(rank, step - start)
        if len(group) > 1:
            # a ring allreduce moves 2 (n - 1) / n of the bytes: 4 ms a pair on a clear link
            seconds = 0.004 * (len(group) - 1) * 2 / len(group) * (4 if slow_rank in group else 1)
            # the highest rank arrives last and waits for nothing but the transfer
            out.append((step, group, seconds * (1 + (rank != max(group)))))
    return out


def _regrouping(comm, topo):
    strategy = DSSyncStrategy(StrategyContext(comm=comm, model=_seeded_linear(0), topology=topo),
                              DSSyncStrategy.Config(adjust_every=20))
    strategy.setup()
    return strategy


def test_regroup_switches_every_rank_at_the_same_step_and_relaxes():
    topo = Topology.from_rack_sizes([5, 3])

    def body(comm):
        strategy = _regrouping(comm, topo)
        initial = strategy.schedule
        strategy.shuffle.records = _timed_records(comm.rank, initial, 20, slow_rank=4)
        assert not strategy.regroup(20)  # one slow window is not enough (regroup.settle)
        strategy.shuffle.records = _timed_records(comm.rank, initial, 20, slow_rank=4, start=20)
        assert strategy.regroup(40)
        paired = strategy.schedule
        strategy.after_step(40)  # the new plan's round 0 runs at step 40
        strategy.shuffle.records = _timed_records(comm.rank, paired, 20, slow_rank=-1, start=40)  # calm again
        assert not strategy.regroup(60)  # one calm window keeps the flag
        strategy.shuffle.records = _timed_records(comm.rank, paired, 20, slow_rank=-1, start=60)
        assert strategy.regroup(80)
        return paired.digest(), [(c["step"], c["reason"], c["uplinks"], c["nics"], c["pace"])
                                 for c in strategy.schedule_changes()], strategy.schedule.digest()

    out = FakeWorld(8).run(body)
    assert len({o[0] for o in out}) == 1 and len({o[2] for o in out}) == 1
    steps_reasons = out[0][1]
    assert steps_reasons == [(0, "initial", [], [], 1), (40, "slow uplinks [], slow NICs [4]", [], [4], 1),
                             (80, "contention cleared", [], [], 1)]
    assert out[0][2] == static_plan(topo).digest()


def test_regroup_paces_the_racks_when_the_cross_rack_group_is_the_bottleneck():
    topo = Topology.from_rack_sizes([4, 4])

    def body(comm):
        strategy = _regrouping(comm, topo)
        for start in (0, 20):  # the cross-rack pair takes nine times an intra-rack group, two windows running
            rec = _timed_records(comm.rank, strategy.schedule, 20, slow_rank=-1, start=start)
            strategy.shuffle.records = [(s, g, t * (9 if min(g) < 4 <= max(g) else 1)) for s, g, t in rec]
            changed = strategy.regroup(start + 20)
            assert changed == (start == 20)
        paced_plan = strategy.schedule
        for start in (40, 60):
            strategy.shuffle.records = _timed_records(comm.rank, paced_plan, 20, slow_rank=-1, start=start)
            changed = strategy.regroup(start + 20)
            assert changed == (start == 60)
        return [(c["step"], c["reason"], c["pace"]) for c in strategy.schedule_changes()], paced_plan.digest(), \
            strategy.schedule.digest()

    out = FakeWorld(8).run(body)
    # nine times asks for a pace of 8; the default bound (regroup.DEFAULT_MAX_PACE) holds it at 2
    assert out[0][0] == [(0, "initial", 1), (40, "racks exchange every 2 rounds", 2), (80, "contention cleared", 1)]
    assert {o[1] for o in out} == {plan(topo, pace=2).digest()}
    assert {o[2] for o in out} == {static_plan(topo).digest()}


def test_ranks_whose_records_disagree_stop_with_an_error():
    topo = Topology.from_rack_sizes([4, 4])

    def body(comm):
        strategy = _regrouping(comm, topo)
        if comm.rank == 0:  # as if rank 0 had planned otherwise from the same window
            strategy.shuffle._plan = lambda topology, pace=1: Schedule(world_size=8, period=((tuple(range(8)),),))
        for start in (0, 20):
            strategy.shuffle.records = _timed_records(comm.rank, strategy.schedule, 20, slow_rank=1, start=start)
            strategy.regroup(start + 20)

    with pytest.raises(ScheduleError, match="ranks planned different schedules at iteration 40"):
        FakeWorld(8).run(body)


@pytest.mark.parametrize("world_every", [0, 3], ids=["groups", "world-every-3"])
@pytest.mark.parametrize("bucket_mb", [0.0, 3e-4, 1.0], ids=["per-layer", "two-buckets", "one-bucket"])
def test_overlapped_mode_computes_what_after_step_mode_computes(bucket_mb, world_every):
    """Averaging in backward hooks, layer by layer or bucket by bucket, is the same arithmetic
    as averaging after the step: same data, same groups, same parameters and EMA at the end."""
    topo = Topology.from_rack_sizes([3, 2])
    buckets = []

    def run(overlap):
        def body(comm):
            gen = torch.Generator().manual_seed(7 + comm.rank)
            model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 3)).double()
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
            strategy = DSSyncStrategy(StrategyContext(comm=comm, model=model, topology=topo),
                                      DSSyncStrategy.Config(overlap=overlap, bucket_mb=bucket_mb,
                                                            world_every=world_every))
            optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
            strategy.setup()
            if strategy.reducer is not None:
                buckets.append([len(b.modules) for b in strategy.reducer.buckets])
            for step in range(7):
                x = torch.randn(6, 4, generator=gen, dtype=torch.float64)
                y = torch.randint(0, 3, (6,), generator=gen)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                strategy.before_step(step)
                optimizer.step()
                strategy.after_step(step)
            final = strategy.final_model()
            return (torch.nn.utils.parameters_to_vector(model.parameters()),
                    torch.nn.utils.parameters_to_vector(final.parameters()))
        return FakeWorld(5).run(body)

    for (p_after, f_after), (p_overlap, f_overlap) in zip(run(False), run(True), strict=True):
        torch.testing.assert_close(p_overlap, p_after)
        torch.testing.assert_close(f_overlap, f_after)
    # Backward order: the last layer (18 doubles, 144 B), then 240 B, then 200 B. A 300 B cap
    # puts the last two layers in one bucket and the first alone.
    assert buckets[-1] == {0.0: [1, 1, 1], 3e-4: [2, 1], 1.0: [3]}[bucket_mb]
    # Groups, not the world: ranks start equal (setup), see different data, and stay apart.
    params = [p for p, _ in run(True)]
    assert not all(torch.equal(params[0], q) for q in params[1:])


def test_every_backend_refuses_groups_that_ranks_disagree_on_or_that_leave_the_world():
    def body(comm):
        mine = [(0, 1), (2, 3)] if comm.rank != 2 else [(0, 2), (1, 3)]
        with pytest.raises(CommunicationError, match=r"ranks \[2\] asked for other groups|ranks \[0, 1, 3\] asked"):
            comm.register_groups(mine)
        with pytest.raises(CommunicationError, match=r"group \[3, 4\] names ranks outside the world of 4"):
            comm.register_groups([(3, 4)])
        return True

    assert FakeWorld(4).run(body) == [True] * 4


def test_a_checkpoint_after_a_regrouping_resumes_the_same_groups_at_every_later_step():
    """state_dict after an online switch (a paired plan from step 40, one calm window since,
    and a window of records half gathered) restores the plan, where it started, the sensed
    contention, the previous window's answer and the records:
    the restored strategy picks the same group at every later step and regroups alike."""
    topo = Topology.from_rack_sizes([5, 3])

    def body(comm):
        strategy = _regrouping(comm, topo)
        for start in (0, 20):
            strategy.shuffle.records = _timed_records(comm.rank, strategy.schedule, 20, slow_rank=4, start=start)
            assert strategy.regroup(start + 20) == (start == 20)
        strategy.shuffle.records = _timed_records(comm.rank, strategy.schedule, 20, slow_rank=-1, start=40)
        assert not strategy.regroup(60)  # one calm window: the flag holds, and the saved state must know it
        strategy.shuffle.records = _timed_records(comm.rank, strategy.schedule, 10, slow_rank=-1, start=60)
        state = strategy.state_dict()
        fresh = DSSyncStrategy(StrategyContext(comm=comm, model=_seeded_linear(1), topology=topo),
                               DSSyncStrategy.Config(adjust_every=20))
        assert fresh.shuffle.group(25) != strategy.shuffle.group(25) or fresh.schedule.digest() != strategy.schedule.digest()
        fresh.load_state_dict(state)
        fresh.setup()
        same = all(fresh.shuffle.group(s) == strategy.shuffle.group(s) for s in range(40, 140))
        more = _timed_records(comm.rank, strategy.schedule, 10, slow_rank=-1, start=70)
        for s in (strategy, fresh):
            s.shuffle.records += more
        return same, strategy.regroup(80), fresh.regroup(80), strategy.schedule.digest(), fresh.schedule.digest()

    out = FakeWorld(8).run(body)
    assert all(o[0] for o in out)
    assert {(o[1], o[2]) for o in out} == {(True, True)}  # second calm window: both relax at step 80
    assert {o[3] for o in out} == {o[4] for o in out}
