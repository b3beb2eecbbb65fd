"""Sync-Switch's hand-off on real gloo processes: with a constant gradient, each round moves
as far before a switch as after it, BSP to ASP and back (a round: one BSP iteration, or the
k ASP pushes of one iteration)."""

import pytest
import torch
from torch import nn

from dssync.launch import run_ranks
from dssync.strategy import StrategyContext
from dssync.topology import Topology

LR, MU, GRAD = 0.1, 0.9, 0.5


def constant_gradient_run(comm, bsp: int, asp: int, back: int):
    """Sync-switch on a 3 x 2 linear layer whose gradient is ``GRAD`` everywhere, always:
    ``bsp`` BSP rounds (the switch point), ``asp`` ASP rounds, a switch back to BSP (greedy's
    move, called directly) and ``back`` BSP rounds. Every round ends with barrier, pull,
    barrier, so that an ASP round is exactly the k pushes of one iteration. Returns the
    parameters after setup and after each round, and each round's phase."""
    from dssync.strategies import SyncSwitchStrategy

    steps = bsp + asp + back
    model = nn.Linear(3, 2)
    strategy = SyncSwitchStrategy(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes(
        [comm.world_size]), steps=steps), SyncSwitchStrategy.Config(switch_at=bsp / steps))
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MU))
    strategy.setup()
    positions = [torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()]
    phases = []
    for step in range(steps):
        phases.append(strategy.phase)
        for p in model.parameters():
            p.grad = torch.full_like(p, GRAD)
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
        if step + 1 == bsp + asp:
            strategy.switch("bsp", step + 1, "the test's switch back")
        comm.barrier()
        strategy.server.pull()
        comm.barrier()
        positions.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    strategy.close()
    return positions, phases


def test_each_round_moves_as_far_after_a_switch_as_before_it_both_ways():
    k, bsp, asp, back = 4, 50, 8, 8
    out = run_ranks(constant_gradient_run, bsp, asp, back, nproc=k, timeout_s=60)
    positions, phases = out[0]
    assert phases == ["bsp"] * bsp + ["asp"] * asp + ["bsp"] * back
    moved = torch.stack([a - b for a, b in zip(positions, positions[1:], strict=False)])
    moves = moved.mean(1).double().tolist()

    # The oracle: one momentum buffer through the whole run, v <- mu v + g, and a round of
    # one update at LR (BSP) or k updates at LR / k (ASP).
    v, want = 0.0, []
    for phase in phases:
        updates = 1 if phase == "bsp" else k
        moved_here = 0.0
        for _ in range(updates):
            v = MU * v + GRAD
            moved_here += LR / updates * v
        want.append(moved_here)
    assert moves == pytest.approx(want, rel=1e-3)

    steady = LR * GRAD / (1 - MU)  # the closed form of both phases' settled rounds
    for switch in (bsp, bsp + asp):
        before = moves[switch - 1]
        assert before == pytest.approx(steady, rel=0.01)
        assert moves[switch:switch + 3] == pytest.approx([before] * 3, rel=0.05), (switch, moves[switch - 2:switch + 4])
