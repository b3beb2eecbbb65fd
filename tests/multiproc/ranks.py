"""Rank functions for the multi-process tests (module level, so spawned ranks import them)."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from dssync.planning.planner import static_plan
from dssync.strategies import DSSyncStrategy
from dssync.strategies.base import StrategyContext
from dssync.topology import Topology


def seeded_vector(rank: int, numel: int) -> torch.Tensor:
    """The tensor rank ``rank`` starts from; the parent recomputes it for the oracle."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(7919 * (rank + 1)),
                       dtype=torch.float64)


def group_averaging(comm, layouts: list[list[int]], numel: int, num_periods: int):
    """For each rack layout: set seeded parameters, run ``num_periods`` periods of DS-Sync
    averaging (no gradient), return the parameters after every step."""
    out = {}
    for sizes in layouts:
        topo = Topology.from_rack_sizes(sizes)
        model = nn.Linear(numel - 1, 1, dtype=torch.float64)
        strategy = DSSyncStrategy(StrategyContext(comm=comm, model=model, topology=topo))
        strategy.setup()
        with torch.no_grad():  # copy into the parameters (they are views of a flat buffer)
            strategy._flat[0].copy_(seeded_vector(comm.rank, numel))
        trace = []
        for step in range(num_periods * len(strategy.schedule.period)):
            strategy.average(step)
            trace.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
        out[tuple(sizes)] = trace
    return out


def raise_on_rank(comm, bad_rank: int):
    if comm.rank == bad_rank:
        raise ValueError("deliberate failure for the test")
    comm.allreduce_(torch.ones(4))


def die_on_rank(comm, bad_rank: int):
    comm.register_groups([tuple(range(comm.world_size))])
    if comm.rank == bad_rank:
        os._exit(3)
    comm.allreduce_(torch.ones(4))
    comm.allreduce_(torch.ones(4))


def straggle_in_group(comm, sleep_s: float):
    comm.register_groups([(0, 1)])
    if comm.rank == 1:
        time.sleep(sleep_s)
    if comm.rank in (0, 1):
        comm.allreduce_(torch.ones(4), (0, 1))
    return "done"


def late_to_barriers(comm, lateness: list[dict[int, float]]):
    """One barrier per entry of ``lateness``: each rank sleeps its time there, then notes
    when it arrived at the barrier and when it left it."""
    seen = []
    for late in lateness:
        time.sleep(late.get(comm.rank, 0.0))
        arrived = time.monotonic()
        comm.barrier()
        seen.append((arrived, time.monotonic()))
    return seen


def die_while_the_others_wait_at_a_barrier(comm, bad_rank: int):
    if comm.rank == bad_rank:
        time.sleep(0.5)
        os._exit(3)
    comm.barrier()


def two_schedules(comm):
    topo = Topology.from_rack_sizes([2, 2])
    schedule = static_plan(topo) if comm.rank != 2 else static_plan(Topology.from_rack_sizes([1, 3]))
    DSSyncStrategy(StrategyContext(comm=comm, model=nn.Linear(2, 2), topology=topo,
                                   schedule=schedule)).setup()


def baseline_gradients(comm, strategy_name: str, rack_sizes: list[int], numel: int):
    """One BSP step's averaged gradient under ``strategy_name`` from seeded per-rank gradients."""
    from dssync.strategies import get_strategy

    model = nn.Linear(numel - 1, 1, dtype=torch.float64)
    cls = get_strategy(strategy_name)
    strategy = cls(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes(rack_sizes)))
    strategy.setup()
    grad = seeded_vector(comm.rank, numel)
    offset = 0
    for p in model.parameters():
        p.grad = grad[offset: offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    strategy.before_step(0)
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def parameter_mixing(comm, strategy_name: str, options: dict, numel: int, steps: int):
    """Seeded parameters, then ``steps`` iterations of the strategy's averaging with no
    gradient: the parameters after every step."""
    from dssync.strategies import get_strategy

    model = nn.Linear(numel - 1, 1, dtype=torch.float64)
    cls = get_strategy(strategy_name)
    strategy = cls(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes([comm.world_size])),
                   cls.Config(**options))
    strategy.setup()
    with torch.no_grad():
        strategy._flat[0].copy_(seeded_vector(comm.rank, numel))
    trace = []
    for step in range(steps):
        strategy.after_step(step)
        trace.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    return trace


def ps_pushes(comm, numel: int, clocks: int, staleness, slow_rank: int | None = None):
    """Every rank pushes the gradient ``(rank + 1) * (clock + 1)`` (all ones) ``clocks`` times
    through the parameter server with lr 1, momentum 0; returns the versions it saw and the
    final parameters."""
    from dssync.ps.server import ParameterServer

    flat = torch.zeros(numel, dtype=torch.float32)
    ps = ParameterServer(comm, flat, lr=1.0, staleness=staleness)
    seen = []
    for clock in range(clocks):
        if comm.rank == slow_rank:
            time.sleep(0.05)
        ps.push_pull(torch.full((numel,), float((comm.rank + 1) * (clock + 1))), clock)
        seen.append(list(ps.versions))
    comm.barrier()
    ps.pull()
    ps.close()
    return seen, flat.clone()


def ps_with_a_silent_worker(comm, numel: int):
    """SSP with bound 0: rank 1 never pushes, so rank 0's first push must time out, named."""
    from dssync.ps.server import ParameterServer

    flat = torch.zeros(numel, dtype=torch.float32)
    ps = ParameterServer(comm, flat, lr=1.0, staleness=0, timeout_s=2.0)
    if comm.rank == 0:
        ps.push_pull(torch.ones(numel), 0)
    else:
        time.sleep(6.0)
    return None


def nccl_smoke(comm):
    """CUDA and CPU collectives in one ``cpu:gloo,cuda:nccl`` world, then ds-sync on a
    CUDA model; everything a GPU job's ranks do, compared by the parent."""
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device())
    on_gpu = torch.full((4,), float(comm.rank + 1), device=device)
    comm.allreduce_async_(on_gpu, average=True).wait()
    on_cpu = torch.full((4,), 10.0 * (comm.rank + 1))
    comm.allreduce_async_(on_cpu, average=True).wait()
    bcast = torch.full((3,), 7.0 if comm.rank == 0 else 0.0, device=device)
    comm.broadcast_(bcast, src=0)
    gathered = comm.allgather_object(comm.rank)
    comm.barrier()
    model = nn.Linear(5, 3).to(device)
    strategy = DSSyncStrategy(StrategyContext(
        comm=comm, model=model, topology=Topology.from_rack_sizes([comm.world_size])))
    strategy.setup()
    for step in range(3):
        strategy.average(step)
    torch.cuda.synchronize()
    return {"backend": str(dist.get_backend()), "device": str(device),
            "cuda_avg": on_gpu.cpu().tolist(), "cpu_avg": on_cpu.tolist(),
            "cuda_bcast": bcast.cpu().tolist(), "gathered": gathered,
            "ds_sync_params_on": str(next(model.parameters()).device)}


def psp_pushes(comm, numel: int, steps: int, quorum, fraction: float, slow_rank=None, delay_rank=None,
               grow: bool = True):
    """Every rank pushes ``(rank + 1) * (step + 1)`` (``(rank + 1)`` if not ``grow``) in every
    element ``steps`` times through a ``PartialServer`` (lr 1, momentum 0); ``slow_rank``
    sleeps before each push, ``delay_rank``'s shard delays every block message by 30 s.
    Returns the versions after each push, this rank's shard's stats and block, and the
    parameters after a final pull (``None`` when a shard delays: its pull would wait)."""
    from dssync.ps.partial import PartialServer

    flat = torch.zeros(numel, dtype=torch.float32)
    delayed = comm.rank == delay_rank
    ps = PartialServer(comm, flat, lr=1.0, push_quorum=quorum, pull_fraction=fraction,
                       delay_prob=1.0 if delayed else 0.0, delay_s=30.0 if delayed else 0.0)
    seen = []
    for step in range(steps):
        if comm.rank == slow_rank:
            time.sleep(0.2)
        ps.push_pull(torch.full((numel,), float((comm.rank + 1) * ((step + 1) if grow else 1))), step)
        seen.append(list(ps.versions))
    ps.set_idle(True)  # as PSPStrategy.final_model does: a slower worker's rounds close without this one
    comm.barrier()
    if delay_rank is None:
        ps.pull()
    final = None if delay_rank is not None else flat.clone()
    comm.barrier()
    ps.close()  # returns once this shard has read every worker's last message: the stats are final
    return seen, ps.stats(), torch.from_numpy(ps.shard.params.copy()), final


def bowl_gradient_target(rank: int, numel: int) -> torch.Tensor:
    """Rank ``rank``'s bowl minimum: its loss is ``0.5 ||w - target||^2``."""
    return seeded_vector(rank + 100, numel).float()


def servers_with_sgd(comm, strategy_name: str, numel: int, steps: int, sgd: dict, options: dict):
    """``strategy_name`` (a parameter-server strategy) on a bowl per rank, the loop's optimizer
    ``torch.optim.SGD(**sgd)``; each rank's gradient is ``w - target_rank`` on the parameters it
    holds. Returns the start and the handed-back parameters."""
    from dssync.strategies import get_strategy

    model = nn.Linear(numel, 1, bias=False)
    cls = get_strategy(strategy_name)
    strategy = cls(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes([comm.world_size]),
                                   steps=steps), cls.Config(**options))
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), **sgd))
    strategy.setup()
    start = model.weight.detach().reshape(-1).clone()
    target = bowl_gradient_target(comm.rank, numel)
    for step in range(steps):
        optimizer.zero_grad()
        model.weight.grad = (model.weight.detach().reshape(-1) - target).reshape(1, -1).clone()
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
    final = strategy.final_model().weight.detach().reshape(-1).clone()
    strategy.close()
    return start, final


def sync_switch_run(comm, steps: int, switch_at: float, momentum: float):
    """``sync-switch`` on a 3 x 2 linear layer whose gradient at step t is ``(r + 1) * (t + 1)``
    on rank r in the BSP phase and ``t + 1`` on every rank in the ASP phase (lr 0.1), so the
    ASP pushes of one step commute. Returns the parameters after setup and after each step,
    the handed-back parameters and the stats."""
    from dssync.strategies import SyncSwitchStrategy

    model = nn.Linear(3, 2)
    strategy = SyncSwitchStrategy(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes(
        [comm.world_size]), steps=steps), SyncSwitchStrategy.Config(switch_at=switch_at))
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum))
    strategy.setup()
    start = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    after = []
    for step in range(steps):
        scale = (comm.rank + 1) if strategy.phase == "bsp" else 1
        for p in model.parameters():
            p.grad = torch.full_like(p, float(scale * (step + 1)))
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
        after.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    final = torch.nn.utils.parameters_to_vector(strategy.final_model().parameters()).detach().clone()
    strategy.close()
    return start, after, final, strategy.stats()


class _Sleep(nn.Module):
    """Slow, parameter-free work: a cancellation point before every slice of it."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x


def specsync_run(comm, steps: int, sleep_s: list[float], abort_time_s: float):
    """``specsync`` in the fixed mode (re-sync on one push by another worker within
    ``abort_time_s``) on a 4 -> 1 linear layer behind ten slices of ``sleep_s[rank]`` seconds
    of sleep, loss = sum of the output on an all-ones input: every gradient is all ones whatever
    the parameters (lr 0.01, no momentum, unscaled). Returns the start, the handed-back
    parameters, the stats and how many computations each iteration ran."""
    from dssync.strategies import SpecSyncStrategy

    model = nn.Sequential(*[_Sleep(sleep_s[comm.rank] / 10) for _ in range(10)], nn.Linear(4, 1))
    n = comm.world_size
    config = SpecSyncStrategy.Config(abort_time_s=abort_time_s, abort_rate=1 / n, scale_lr=False)
    strategy = SpecSyncStrategy(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes([n]),
                                                steps=steps), config)
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    strategy.setup()
    start = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    runs = []
    for step in range(steps):
        ran = [0]

        def forward_backward(ran=ran):
            ran[0] += 1
            loss = model(torch.ones(1, 4)).sum()
            optimizer.zero_grad()
            loss.backward()
            return loss

        strategy.compute(step, forward_backward)
        runs.append(ran[0])
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
    final = torch.nn.utils.parameters_to_vector(strategy.final_model().parameters()).detach().clone()
    strategy.close()
    return start, final, strategy.stats(), runs


def sync_switch_policy_run(comm, steps: int, switch_at: float, policy: str, min_gap: float = 0.0):
    """``sync-switch`` with a straggler ``policy`` (windows of 2 iterations, one window makes a
    straggler, no momentum, lr 0.1, the detector's ``min_gap``) on a 3 x 2 linear layer: the
    gradient is ``(r + 1)(t + 1)`` on rank r in BSP and ``t + 1`` in ASP. Every rank's
    forward/backward takes 50 ms, rank 3's 500 ms in its first 4 iterations (at 10 ms a
    descheduled fast rank looked like a straggler on a loaded 2-core CI machine). Returns the
    start, the handed-back parameters, the stats and the iterations each rank computed."""
    from dssync.strategies import SyncSwitchStrategy

    model = nn.Linear(3, 2)
    config = SyncSwitchStrategy.Config(switch_at=switch_at, policy=policy, window=2, consecutive=1,
                                       min_gap=min_gap)
    strategy = SyncSwitchStrategy(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes(
        [comm.world_size]), steps=steps), config)
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    strategy.setup()
    start = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    computed = []
    for step in range(steps):
        def forward_backward(step=step):
            time.sleep(0.5 if comm.rank == 3 and step < 4 else 0.05)
            scale = (comm.rank + 1) if strategy.phase == "bsp" else 1
            for p in model.parameters():
                p.grad = torch.full_like(p, float(scale * (step + 1)))
            computed.append(step)

        strategy.compute(step, forward_backward)
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
    final = torch.nn.utils.parameters_to_vector(strategy.final_model().parameters()).detach().clone()
    strategy.close()
    return start, final, strategy.stats(), computed


def peer_batches(rank: int, step: int, batch: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s minibatch of iteration ``step``; the parent recomputes it for the oracle."""
    gen = torch.Generator().manual_seed(104_729 * (rank + 1) + step)
    return (torch.randn(batch, 5, generator=gen, dtype=torch.float64),
            torch.randint(0, 3, (batch,), generator=gen))


def peer_model() -> nn.Module:
    torch.manual_seed(0)  # the same initialisation on every rank and in the parent
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def peer_training(comm, strategy_name: str, steps: int, lr: float, momentum: float):
    """``steps`` iterations of the training loop's calls (``training_module``, ``wrap_optimizer``,
    ``before_step``/``after_step``) on seeded per-rank batches; the parameters after each."""
    from dssync.strategies import get_strategy

    model = peer_model()
    strategy = get_strategy(strategy_name)(StrategyContext(comm=comm, model=model,
                                                           topology=Topology.from_rack_sizes([comm.world_size])))
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum))
    strategy.setup()
    net = strategy.training_module()
    trace = []
    for step in range(steps):
        x, y = peer_batches(comm.rank, step)
        loss = nn.functional.cross_entropy(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
        trace.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    return trace


def seeded_step_gradient(rank: int, step: int, numel: int) -> torch.Tensor:
    """The gradient rank ``rank`` applies at iteration ``step``; the parent recomputes it."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(31 * step + 7919 * (rank + 1)),
                       dtype=torch.float64)


def averaging_with_seeded_gradients(comm, strategy_name: str, options: dict, rack_sizes: list[int],
                                     numel: int, steps: int):
    """Every rank starts from rank 0's seeded vector (setup broadcasts it), applies its own seeded
    gradient with plain SGD (lr 1) each iteration through the strategy; the parameters after each."""
    from dssync.strategies import get_strategy

    model = nn.Linear(numel - 1, 1, dtype=torch.float64)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(seeded_vector(comm.rank, numel), model.parameters())
    cls = get_strategy(strategy_name)
    strategy = cls(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes(rack_sizes)),
                   cls.Config(**options))
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    strategy.setup()
    trace = []
    for step in range(steps):
        grad = seeded_step_gradient(comm.rank, step, numel)
        offset = 0
        for p in model.parameters():
            p.grad = grad[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
        trace.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    handed_back = strategy.final_model()
    return trace, torch.nn.utils.parameters_to_vector(handed_back.parameters()).detach().clone()


def handed_back_and_plain_average(comm, steps: int, eval_every: int, options: dict):
    """ds-sync on ``digits`` through the strategy API; at every evaluation the handed-back model's
    parameters and every rank's current parameters (the parent averages those itself)."""
    from dssync.training.tasks import build_task

    task = build_task("digits", seed=3)
    model = task.model
    strategy = DSSyncStrategy(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes([2, 2]),
                                              steps=steps), DSSyncStrategy.Config(**options))
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    strategy.setup()
    batches = task.batches(comm.rank, comm.world_size, 32, seed=3)
    out = []
    for step in range(steps):
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
        if (step + 1) % eval_every == 0:
            handed = torch.nn.utils.parameters_to_vector(strategy.final_model().parameters()).detach().clone()
            mine = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
            out.append((step + 1, handed, comm.allgather_object(mine)))
    return out


def constant_gradient_rounds(comm, bsp: int, asp: int, back: int, lr: float, mu: float, grad: float):
    """Sync-switch on a 3 x 2 linear layer whose gradient is ``grad`` everywhere, always: ``bsp``
    BSP rounds (the switch point), ``asp`` ASP rounds, a switch back to BSP (greedy's move,
    called here directly) and ``back`` BSP rounds. After every round all workers meet, pull and
    meet again, so that an ASP round is exactly the k pushes of one iteration (with one gradient
    everywhere, their order does not matter). Returns the parameters after setup and after each
    round, each round's phase, and the strategy's stats."""
    from dssync.strategies import SyncSwitchStrategy

    steps = bsp + asp + back
    model = nn.Linear(3, 2)
    strategy = SyncSwitchStrategy(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes(
        [comm.world_size]), steps=steps), SyncSwitchStrategy.Config(switch_at=bsp / steps))
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=mu))
    strategy.setup()
    positions = [torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()]
    phases = []
    for step in range(steps):
        phases.append(strategy.phase)
        for p in model.parameters():
            p.grad = torch.full_like(p, grad)
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)  # switches to ASP after the bsp-th round
        if step + 1 == bsp + asp:
            strategy.switch("bsp", step + 1, "the test's switch back")
        comm.barrier()  # every push of the round is applied
        strategy.server.pull()
        comm.barrier()  # and no push of the next round is, until every worker has pulled
        positions.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    stats = strategy.stats()
    strategy.close()
    return positions, phases, stats


def averager_loop(comm, task_name: str, steps: int, seed: int, options: dict, resume_at: int | None,
                  device: str = "cpu"):
    """A plain training loop with ``DSSyncAverager`` inside torch's ``PostLocalSGDOptimizer``
    (momentum SGD, ``Task.batches``); with ``resume_at``, the loop's parts are rebuilt from
    their ``state_dict``s there, as a restarted job would. Returns this rank's parameters."""
    import torch.nn.functional as F
    from torch.distributed.optim import PostLocalSGDOptimizer

    from dssync import DSSyncAverager
    from dssync.training.tasks import build_task

    def build(state=None):
        task = build_task(task_name, seed=seed)
        if device == "cuda":
            task.to(torch.device("cuda", torch.cuda.current_device()))
        averager = DSSyncAverager(steps=steps, model=task.model, **options)
        optimizer = PostLocalSGDOptimizer(torch.optim.SGD(task.model.parameters(), lr=0.05, momentum=0.9), averager)
        if state is not None:
            task.model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            averager.load_state_dict(state["averager"])
        return task, optimizer, averager

    task, optimizer, averager = build()
    for p in task.model.parameters():  # what dssync train's setup does (the inits agree anyway)
        comm.broadcast_(p.data, src=0)
    first = 0
    for stop in ([resume_at, steps] if resume_at else [steps]):
        batches = task.batches(comm.rank, comm.world_size, 32, seed, start=first)
        for _ in range(first, stop):
            x, y = next(batches)
            loss = F.cross_entropy(task.model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if stop < steps:  # through bytes, as a checkpoint file would be
            import io
            buf = io.BytesIO()
            torch.save({"model": task.model.state_dict(), "optimizer": optimizer.state_dict(),
                        "averager": averager.state_dict()}, buf)
            buf.seek(0)
            state = torch.load(buf, weights_only=True, map_location=device)  # plain data and tensors only
            task, optimizer, averager = build()
            _refuses_malformed_states(averager, state["averager"])
            task, optimizer, averager = build(state)
            first = stop
    final = averager.final_model(task.model)
    return ({k: v.clone() for k, v in task.model.state_dict().items()}, averager.step,
            [(c["step"], c["reason"]) for c in averager.schedule_changes()],
            {k: v.clone() for k, v in final.state_dict().items()})


def _refuses_malformed_states(averager, good: dict) -> None:
    """A malformed averager state is a one-line ``DssyncError``, and the averager is as before."""
    import copy

    from dssync.errors import DssyncError

    broken = []
    for path, value in [(("step",), "7"), (("shuffle",), [1]), (("ensemble",), "x"),
                        (("shuffle", "start"), 2.5), (("shuffle", "records"), [(1, ("a",), 0.1)]),
                        (("shuffle", "contention"), [[True], []]), (("shuffle", "schedule"), {"version": 1})]:
        state = copy.deepcopy(good)
        where = state
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
        broken.append(state)
    broken.append({k: v for k, v in good.items() if k != "shuffle"})
    before = (averager.step, averager.schedule.digest(), list(averager.schedule_changes()))
    for state in broken:
        try:
            averager.load_state_dict(state)
        except DssyncError as exc:
            assert len(str(exc).splitlines()) == 1, str(exc)
        else:
            raise AssertionError(f"accepted a malformed averager state: {state!r:.200}")
        assert (averager.step, averager.schedule.digest(), list(averager.schedule_changes())) == before


def what_the_rank_sees(comm, name: str):
    """The environment variable ``name``, the working directory, and a line written to fd 2
    (in one write: two ranks' ``print`` calls, text and newline apart, can interleave)."""
    import os

    os.write(2, f"rank {comm.rank} writes here\n".encode())
    return os.environ.get(name), os.getcwd()
