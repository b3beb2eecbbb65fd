"""Sync-Switch's hand-off of the momentum at a switch, against a constant-gradient oracle.

A round is one BSP iteration (the k pushes averaged, one update with the loop's rate) or
k ASP updates (one per worker push, each with the rate / k). With every worker's gradient a
constant g, the momentum buffer settles at g / (1 - mu) in both phases, so a round moves
lr * g / (1 - mu) in both; a hand-off that keeps the per-round movement continuous moves the
first rounds after a switch, in either direction, as far as the rounds before it.
"""

import pytest
import torch
from ranks import constant_gradient_rounds

from dssync.collectives import FakeWorld

LR, MU, GRAD = 0.1, 0.9, 1.0
TOLERANCE = 0.05  # the bound on the per-round movement across a switch


def sgd_oracle(k: int, phases: list[str], *, buffer_scale: float = 1.0) -> list[float]:
    """Each round's movement under torch's own SGD with momentum on one parameter: a BSP round
    is one step at ``LR`` on the mean of k equal gradients, an ASP round k steps at ``LR / k``.
    The optimizer (and its momentum buffer) lives through the switches, as the TF checkpoint
    carries its momentum slots through the paper's restart; ``buffer_scale`` multiplies the
    buffer at each switch to ASP (and divides it at each switch back), the old hand-off."""
    p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([p], lr=LR, momentum=MU)
    moves, before = [], None
    for phase in phases:
        if before is not None and phase != before and "momentum_buffer" in opt.state[p]:
            opt.state[p]["momentum_buffer"] *= buffer_scale if phase == "asp" else 1 / buffer_scale
        before = phase
        start = p.item()
        updates, rate = (1, LR) if phase == "bsp" else (k, LR / k)
        opt.param_groups[0]["lr"] = rate
        for _ in range(updates):
            p.grad = torch.full_like(p, GRAD)
            opt.step()
        moves.append(start - p.item())
    return moves


def discontinuities(moves: list[float], phases: list[str], after: int = 3) -> list[tuple[int, float]]:
    """``(round, relative change)`` for each of the first ``after`` rounds after every switch
    whose movement differs from the last round's before the switch by more than 5 %."""
    out = []
    for r in range(1, len(phases)):
        if phases[r] != phases[r - 1]:
            for q in range(r, min(r + after, len(phases))):
                change = moves[q] / moves[r - 1] - 1
                if abs(change) > TOLERANCE:
                    out.append((q, round(change, 3)))
    return out


def test_the_oracle_and_the_criterion_catch_the_old_times_k_hand_off():
    """The issue's figures (k = 8, mu = 0.9: 54.8, 29.3, 18.3, 13.6 per round against a steady
    10.0, here in units of lr * g) come out of the oracle with the buffer times k; the buffer
    carried unchanged moves the steady lr * g / (1 - mu) on both sides of both switches."""
    k = 8
    phases = ["bsp"] * 60 + ["asp"] * 10 + ["bsp"] * 10
    steady = LR * GRAD / (1 - MU)
    old = sgd_oracle(k, phases, buffer_scale=k)
    assert [round(m / (LR * GRAD), 1) for m in old[60:64]] == [54.8, 29.3, 18.3, 13.6]
    assert old[59] == pytest.approx(steady, rel=0.01)
    assert discontinuities(old, phases)  # both directions: a burst into ASP, a stall back in BSP
    assert old[70] < 0.5 * steady
    kept = sgd_oracle(k, phases)
    assert discontinuities(kept, phases) == []
    assert kept[55:] == pytest.approx([steady] * len(kept[55:]), rel=0.01)


def test_the_servers_move_each_round_as_far_before_and_after_a_switch_both_ways():
    """8 workers (threads, the real shards over localhost TCP), mu = 0.9: 50 BSP rounds, 10 ASP,
    back to BSP for 10. Each round's movement matches the oracle, and the first three rounds
    after each switch move within 5 % of the round before it."""
    k, bsp, asp, back = 8, 50, 10, 10
    out = FakeWorld(k, timeout_s=60).run(lambda comm: constant_gradient_rounds(comm, bsp, asp, back, LR, MU, GRAD))
    positions, phases, stats = out[0]
    assert phases == ["bsp"] * bsp + ["asp"] * asp + ["bsp"] * back
    assert [(s["to"], s["step"]) for s in stats["switches"]] == [("asp", bsp), ("bsp", bsp + asp)]
    for other, _, _ in out[1:]:
        torch.testing.assert_close(other[-1], positions[-1])
    moved = torch.stack([a - b for a, b in zip(positions, positions[1:], strict=False)])
    torch.testing.assert_close(moved, moved[:, :1].expand_as(moved), rtol=1e-4, atol=1e-5)  # every parameter alike
    moves = moved[:, 0].double().tolist()
    assert moves == pytest.approx(sgd_oracle(k, phases), rel=1e-3)
    assert discontinuities(moves, phases) == []
    steady = LR * GRAD / (1 - MU)
    assert moves[bsp - 1:] == pytest.approx([steady] * (asp + back + 1), rel=0.01)
