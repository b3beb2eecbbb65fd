"""Sync-Switch's hand-off on real gloo processes: with a constant gradient, each round moves
as far before a switch as after it, BSP to ASP and back (a round: one BSP iteration, or the
k ASP pushes of one iteration)."""

import pytest
import torch
from ranks import constant_gradient_rounds

from dssync.launch import run_ranks

LR, MU, GRAD = 0.1, 0.9, 0.5


def test_each_round_moves_as_far_after_a_switch_as_before_it_both_ways():
    k, bsp, asp, back = 4, 50, 8, 8
    out = run_ranks(constant_gradient_rounds, bsp, asp, back, LR, MU, GRAD, nproc=k, timeout_s=60)
    positions, phases, _ = out[0]
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
