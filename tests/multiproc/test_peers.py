"""The peers users run today (torch DDP, torch's hierarchical model averaging, DiLoCo) on real
gloo process groups, each against an oracle computed here from its definition."""

import pytest
import torch
from ranks import (
    averaging_with_seeded_gradients,
    peer_batches,
    peer_model,
    peer_training,
    seeded_step_gradient,
    seeded_vector,
)

from dssync.launch import run_ranks

pytestmark = pytest.mark.dist

NUMEL = 301


def _bsp_oracle(n: int, steps: int, lr: float, momentum: float) -> list[torch.Tensor]:
    """One process: each step's loss is the mean over the n ranks' batches (equal sizes, so the
    mean over their union), one SGD step on it."""
    model = peer_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    trace = []
    for step in range(steps):
        batches = [peer_batches(r, step) for r in range(n)]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trace.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    return trace


@pytest.mark.parametrize("strategy", ["ddp", "allreduce"])
def test_ddp_and_allreduce_take_the_bsp_step_on_the_union_of_the_batches(strategy):
    n, steps, lr, momentum = 4, 6, 0.3, 0.9
    out = run_ranks(peer_training, strategy, steps, lr, momentum, nproc=n, timeout_s=60)
    oracle = _bsp_oracle(n, steps, lr, momentum)
    for trace in out:
        for got, want in zip(trace, oracle, strict=True):
            torch.testing.assert_close(got, want)
    assert not torch.equal(oracle[0], oracle[-1])  # the steps moved the model


def test_ddp_and_allreduce_take_the_same_steps():
    n, steps = 3, 5
    ddp = run_ranks(peer_training, "ddp", steps, 0.2, 0.5, nproc=n, timeout_s=60)
    ours = run_ranks(peer_training, "allreduce", steps, 0.2, 0.5, nproc=n, timeout_s=60)
    for a, b in zip(ddp, ours, strict=True):
        torch.testing.assert_close(torch.stack(a), torch.stack(b))


@pytest.mark.parametrize("rack_sizes", [[2, 2], [3, 2], [1, 3, 2]])
def test_torch_hier_averages_in_racks_and_over_the_world_at_its_periods(rack_sizes):
    n, steps, world_period = sum(rack_sizes), 10, 4
    racks, start = [], 0
    for size in rack_sizes:
        racks.append(list(range(start, start + size)))
        start += size
    trace, handed_back = zip(*run_ranks(averaging_with_seeded_gradients, "torch-hier",
                                        {"world_period": world_period}, rack_sizes, NUMEL, steps,
                                        nproc=n, timeout_s=60), strict=True)
    x = [seeded_vector(0, NUMEL)] * n  # setup() gave every rank rank 0's parameters
    for step in range(steps):
        x = [x[r] - seeded_step_gradient(r, step, NUMEL) for r in range(n)]  # the local SGD step
        groups = [list(range(n))] if step % world_period == 0 else racks
        for group in groups:
            mean = torch.stack([x[r] for r in group]).mean(0)
            for r in group:
                x[r] = mean
        for r in range(n):
            torch.testing.assert_close(trace[r][step], x[r])
    world_mean = torch.stack(x).mean(0)
    for r in range(n):
        torch.testing.assert_close(handed_back[r], world_mean)
    assert not torch.allclose(x[0], x[-1])  # the last step averaged racks, not the world


@pytest.mark.parametrize(("inner_steps", "outer_lr", "outer_momentum"), [(3, 0.7, 0.9), (2, 1.0, 0.0)])
def test_diloco_takes_nesterov_outer_steps_on_the_mean_pseudo_gradient(inner_steps, outer_lr, outer_momentum):
    n, steps = 4, 8
    options = {"inner_steps": inner_steps, "outer_lr": outer_lr, "outer_momentum": outer_momentum}
    trace, handed_back = zip(*run_ranks(averaging_with_seeded_gradients, "diloco", options, [n], NUMEL, steps,
                                        nproc=n, timeout_s=60), strict=True)
    outer = seeded_vector(0, NUMEL)
    buf = None
    x = [outer.clone() for _ in range(n)]
    for step in range(steps):
        x = [x[r] - seeded_step_gradient(r, step, NUMEL) for r in range(n)]  # inner SGD, lr 1
        if (step + 1) % inner_steps == 0:  # DiLoCo, Algorithm 1: outer Nesterov step
            delta = torch.stack([outer - x[r] for r in range(n)]).mean(0)
            buf = delta if buf is None else outer_momentum * buf + delta
            outer = outer - outer_lr * (delta + outer_momentum * buf)
            x = [outer.clone() for _ in range(n)]
        for r in range(n):
            torch.testing.assert_close(trace[r][step], x[r])
    for r in range(n):  # the handed-back model is the outer model, not the drifted locals
        torch.testing.assert_close(handed_back[r], outer)
    assert steps % inner_steps == 0 or not torch.allclose(x[0], outer)
