"""The baseline strategies and the parameter server on real gloo process groups and real
sockets, each against an oracle computed here."""

import pytest
import torch
from ranks import (
    baseline_gradients,
    bowl_gradient_target,
    parameter_mixing,
    ps_pushes,
    ps_with_a_silent_worker,
    psp_pushes,
    seeded_vector,
    servers_with_sgd,
    specsync_run,
    sync_switch_policy_run,
    sync_switch_run,
)

from dssync.errors import DssyncError
from dssync.launch import run_ranks
from dssync.patterns import gossip_peers

NUMEL = 1001


@pytest.mark.parametrize("rack_sizes", [[2, 3], [1, 2, 2], [5]])
def test_hierarchical_gives_exactly_the_world_mean_gradient(rack_sizes):
    n = sum(rack_sizes)
    out = run_ranks(baseline_gradients, "hierarchical", rack_sizes, NUMEL, nproc=n, timeout_s=60)
    mean = torch.stack([seeded_vector(r, NUMEL) for r in range(n)]).mean(0)
    for got in out:
        torch.testing.assert_close(got, mean)


def test_local_sgd_averages_over_the_world_every_period_and_only_then():
    n, period, steps = 4, 3, 7
    trace = run_ranks(parameter_mixing, "local-sgd", {"period": period}, NUMEL, steps, nproc=n, timeout_s=60)
    start = [seeded_vector(r, NUMEL) for r in range(n)]
    mean = torch.stack(start).mean(0)
    for step in range(steps):
        averaged = (step + 1) >= period
        for r in range(n):
            torch.testing.assert_close(trace[r][step], mean if averaged else start[r])


@pytest.mark.parametrize("period", [1, 2])
def test_gossip_mixes_pairwise_every_period_keeps_the_mean_and_reaches_consensus(period):
    n, steps = 8, 3 * period  # three exchanges, of offsets 1, 2, 4
    trace = run_ranks(parameter_mixing, "gossip", {"period": period}, NUMEL, steps, nproc=n, timeout_s=60)
    x = [seeded_vector(r, NUMEL) for r in range(n)]
    mean = torch.stack(x).mean(0)
    exchange = 0
    for step in range(steps):  # oracle: the same pairwise averages, computed here
        if (step + 1) % period == 0:
            x = [(x[r] + x[(r - (1 << exchange)) % n]) / 2 for r in range(n)]
            exchange += 1
        for r in range(n):
            torch.testing.assert_close(trace[r][step], x[r])
        torch.testing.assert_close(torch.stack([trace[r][step] for r in range(n)]).mean(0), mean)
    # After log2(n) exchanges of the exponential graph every rank holds the exact mean.
    for r in range(n):
        torch.testing.assert_close(trace[r][steps - 1], mean)
    if period > 1:  # and not before its first exchange
        assert not torch.equal(trace[0][period - 2], mean)


@pytest.mark.parametrize(("n", "staleness"), [(3, None), (3, 0), (4, 2)])
def test_parameter_server_applies_every_push_and_keeps_the_staleness_bound(n, staleness):
    clocks, numel = 6, 257
    out = run_ranks(ps_pushes, numel, clocks, staleness, 1, nproc=n, timeout_s=60)
    total = sum((r + 1) * (c + 1) for r in range(n) for c in range(clocks))
    for seen, final in out:
        torch.testing.assert_close(final, torch.full((numel,), -float(total)))
        if staleness is not None:  # at clock c every worker had pushed c + 1 - s times
            for clock, versions in enumerate(seen):
                assert min(versions) >= n * (clock + 1 - staleness), (clock, versions)


def test_a_worker_that_stops_pushing_is_named_not_waited_on():
    with pytest.raises(DssyncError, match=r"rank 0: .* shard of rank 0: .*waited 2 s for workers \[1\]"):
        run_ranks(ps_with_a_silent_worker, 64, nproc=2, timeout_s=30, job_timeout_s=120)


def test_gossip_peers_form_a_shift_whose_offsets_double():
    for n in (2, 5, 8, 12):
        dims = (n - 1).bit_length()
        for step in range(2 * dims):
            sends = {}
            for r in range(n):
                dst, src = gossip_peers(r, n, step)
                assert dst != r and src != r
                assert gossip_peers(dst, n, step)[1] == r  # whom I send to receives from me
                assert (dst - r) % n == (1 << (step % dims)) % n
                sends[r] = dst
            assert sorted(sends.values()) == list(range(n))  # a permutation: doubly stochastic
    assert gossip_peers(0, 1, 0) is None


def test_parameter_server_strategies_refuse_an_optimizer_they_cannot_run():
    from torch import nn

    from dssync.collectives.fake import FakeWorld
    from dssync.strategies import ASPStrategy
    from dssync.strategies.base import StrategyContext
    from dssync.topology import Topology

    def body(comm):
        model = nn.Linear(3, 2)
        strategy = ASPStrategy(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes([1])))
        with pytest.raises(DssyncError, match="torch.optim.SGD"):
            strategy.wrap_optimizer(torch.optim.Adam(model.parameters()))
        with pytest.raises(DssyncError, match="wrap_optimizer"):
            strategy.setup()
    FakeWorld(1).run(body)


SERVER_SGD = [
    {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05},
    {"lr": 0.2, "momentum": 0.5, "dampening": 0.3, "weight_decay": 0.01},
]


@pytest.mark.parametrize("sgd", SERVER_SGD)
@pytest.mark.parametrize(("strategy", "n", "options"), [
    ("psp", 3, {}),  # c = k, b = 1: synchronous rounds on the mean gradient
    ("sync-switch", 2, {"switch_at": 1.0}),  # its BSP phase, on the same rounds
    ("asp", 1, {}),  # one worker: every push is one step of its own
])
def test_the_servers_step_as_torch_sgd_with_the_loops_settings(strategy, n, options, sgd):
    """The oracle: one process, ``torch.optim.SGD`` with the same settings on the mean of the
    ranks' bowl losses. Weight decay, Nesterov and dampening hold on the servers as in the loop."""
    numel, steps = 37, 6
    out = run_ranks(servers_with_sgd, strategy, numel, steps, sgd, options, nproc=n, timeout_s=60)
    w = out[0][0].clone().requires_grad_(True)
    targets = torch.stack([bowl_gradient_target(r, numel) for r in range(n)])
    oracle = torch.optim.SGD([w], **sgd)
    for _ in range(steps):
        oracle.zero_grad()
        (0.5 * ((w - targets) ** 2).sum(1).mean()).backward()
        oracle.step()
    for _, final in out:
        torch.testing.assert_close(final, w.detach(), rtol=1e-5, atol=1e-6)
    moved_without_decay = out[0][0].clone()  # a server that dropped the weight decay would differ
    plain = torch.optim.SGD([moved_without_decay.requires_grad_(True)], **dict(sgd, weight_decay=0.0))
    for _ in range(steps):
        plain.zero_grad()
        (0.5 * ((moved_without_decay - targets) ** 2).sum(1).mean()).backward()
        plain.step()
    assert not torch.allclose(out[0][1], moved_without_decay.detach(), rtol=1e-5, atol=1e-6)


def test_psp_with_every_push_and_every_block_is_synchronous_sgd():
    """c = k, b = 1: each round applies every worker's gradient of that step, lr * sum / k."""
    n, steps, numel = 3, 5, 101
    out = run_ranks(psp_pushes, numel, steps, None, 1.0, nproc=n, timeout_s=60)
    want = -sum((r + 1) * (t + 1) for r in range(n) for t in range(steps)) / n
    for seen, stats, block, final in out:
        assert seen == [[t + 1] * n for t in range(steps)]  # every block fresh after every push
        assert stats["rounds"] == steps and stats["dropped"] == 0
        assert stats["joined"] == [list(range(n))] * steps
        torch.testing.assert_close(block, torch.full_like(block, want))
        torch.testing.assert_close(final, torch.full((numel,), want))


def test_psp_closes_a_round_on_the_first_c_pushes_and_drops_stale_ones():
    """c = 2 of 3 with rank 2 slow: a round closes on two pushes, or on fewer once every
    active worker has pushed since it opened (stale pushes count) or only one is left. Every push
    is applied or dropped as stale, and each block is its rounds' sum / k."""
    n, steps, numel = 3, 6, 64
    out = run_ranks(psp_pushes, numel, steps, 2, 1.0, 2, None, False, nproc=n, timeout_s=60)
    for _, stats, block, _ in out:
        joined = stats["joined"]
        assert all(1 <= len(j) <= 2 for j in joined), joined  # never more than c
        assert sum(len(j) == 2 for j in joined) >= len(joined) // 2, joined  # mostly on c while all push
        assert sum(len(j) for j in joined) + stats["dropped"] == n * steps, stats
        want = -sum(r + 1 for j in joined for r in j) / n
        torch.testing.assert_close(block, torch.full_like(block, want))
    shards = [block for _, _, block, _ in out]
    for _, _, _, final in out:  # a final pull hands every worker every shard's block
        torch.testing.assert_close(final, torch.cat(shards))


def test_psp_partial_pull_goes_on_without_a_delayed_shard():
    """b = 1/2 of 2 shards; rank 1's shard delays every block by 30 s. Workers take shard 0's
    blocks and go on: shard 1 applies its first round and drops every later push, computed
    on its version 0, as stale."""
    n, steps, numel = 2, 4, 32
    out = run_ranks(psp_pushes, numel, steps, None, 0.5, None, 1, nproc=n, timeout_s=60)
    for seen, _, _, _ in out:
        assert seen == [[t + 1, 0] for t in range(steps)]
    stats0, stats1 = out[0][1], out[1][1]
    assert stats0["rounds"] == steps and stats0["delayed"] == 0
    assert stats1["rounds"] == 1 and stats1["dropped"] == n * (steps - 1) and stats1["delayed"] >= 1
    first = -sum(r + 1 for r in range(n)) / n
    torch.testing.assert_close(out[1][2], torch.full_like(out[1][2], first))


def test_sync_switch_trains_bsp_then_hands_the_shards_to_asp():
    """3 workers, 4 steps, switch after 3 (momentum 0.5, lr 0.1). BSP: each step moves every
    parameter by lr times the velocity of the mean gradient, as allreduce would. ASP: the
    shards start from that velocity unchanged (a round of k pushes at lr / k moves lr times
    the buffer, as a BSP round does) and apply each of the last step's k equal pushes at
    once with lr / k."""
    n, lr, m = 3, 0.1, 0.5
    out = run_ranks(sync_switch_run, 4, 0.75, m, nproc=n, timeout_s=60)
    start = out[0][0]
    velocity, want = 0.0, start.clone()
    for t in range(3):
        velocity = m * velocity + (t + 1) * (n + 1) / 2  # the mean of (r + 1)(t + 1)
        want -= lr * velocity
        for _, after, _, _ in out:
            torch.testing.assert_close(after[t], want)

    def asp_step(buf: float) -> torch.Tensor:
        moved = 0.0
        for _ in range(n):  # k pushes of the gradient 4 (step 3), in any order
            buf = m * buf + 4.0
            moved += lr / n * buf
        return want - moved

    for _, _, final, stats in out:
        assert stats["switch_step"] == 3 and stats["phase"] == "asp" and stats["switch_s"] > 0
        assert [(s["to"], s["step"], s["final"]) for s in stats["switches"]] == [("asp", 3, True)]
        torch.testing.assert_close(final, asp_step(velocity))
        assert not torch.allclose(final, asp_step(0.0))  # a switch that dropped the momentum would differ
        assert not torch.allclose(final, asp_step(n * velocity))  # nor one that scaled it by k


def test_psp_with_stale_blocks_and_delays_does_not_stall():
    """8 workers, c = 5, b = 0.75, 10 % of block messages delayed by 1 s: workers push stale
    gradients for the shards whose blocks they skipped. Rounds that waited only for fresh
    pushes stalled here (two of three runs until the timeout); every run must finish."""
    from dssync.training.loop import TrainConfig, train

    record = train(TrainConfig(strategy="psp", task="digits", steps=60, seed=2, eval_every=20, timeout_s=60,
                               strategy_options={"push_quorum": 5, "pull_fraction": 0.75, "delay_prob": 0.1,
                                                 "delay_s": 1.0}), nproc=8)
    shards = record["strategy_stats"]
    assert record["final_accuracy"] > 0.7
    assert all(s["rounds"] > 0 and all(1 <= len(j) <= 5 for j in s["joined"]) for s in shards)
    assert sum(s["delayed"] for s in shards) > 0 and sum(s["dropped"] for s in shards) > 0


def test_specsync_restarts_a_stale_worker_once_and_loses_no_push():
    """Rank 2 computes for 0.4 s, the others for 0.1 s, and one push by another worker within
    0.3 s of an iteration's start re-syncs it: workers abort, pull and recompute, at most
    once an iteration, and every iteration still pushes exactly one gradient (the oracle:
    all-ones gradients, so the final parameters are the start minus lr x n x steps).

    The margins hold on a loaded machine: the others push at least every 0.2 s plus overhead
    (one restart each), well inside the window, and their ten iterations outlast rank 2's
    first 0.4 s and its second iteration's window (a 0.11 s window against 0.1 s iterations
    once saw no push in either of rank 2's windows)."""
    n, steps = 3, 10
    out = run_ranks(specsync_run, steps, [0.1, 0.1, 0.4], 0.3, nproc=n, timeout_s=60)
    start = out[0][0]
    for _, final, _, runs in out:
        torch.testing.assert_close(final, start - 0.01 * n * steps)
        assert set(runs) <= {1, 2}, runs  # never more than one restart
    stats = [s for _, _, s, _ in out]
    aborts = [s["aborts"] for s in stats]
    restarts = [s["aborts"] - s["aborted_before_start"] for s in stats]  # the rest pulled before computing
    assert restarts == [sum(r == 2 for r in runs) for _, _, _, runs in out]
    assert aborts[2] >= 1, stats  # the slow worker is overtaken in every window while the others run
    assert sum(aborts) <= stats[0]["resyncs_sent"] <= n * (steps - 1), stats  # iteration 0 has no notify


def _sync_switch_oracle(n: int, lr: float, phases: list[tuple[int, str, list[int]]]) -> float:
    """How far every parameter moves: BSP steps apply lr * sum over the workers in the round of
    (r + 1)(t + 1) / n, ASP steps lr / n * (t + 1) per worker (no momentum, so order-free)."""
    moved = 0.0
    for t, phase, workers in phases:
        moved += lr * sum((r + 1) * (t + 1) for r in workers) / n if phase == "bsp" else lr / n * (t + 1) * len(workers)
    return moved


def test_sync_switch_elastic_trains_bsp_without_the_straggler_until_the_switch_point():
    """4 workers, 10 steps, BSP for 4, windows of 2 iterations; worker 3 is ten times slower for
    its first iterations. Elastic removes it after the first window, BSP rounds go on with
    the other three (sum / k), and it rejoins for ASP at the switch point."""
    n, steps, lr = 4, 10, 0.1
    out = run_ranks(sync_switch_policy_run, steps, 0.4, "elastic", nproc=n, timeout_s=90)
    everyone, three = list(range(n)), [0, 1, 2]
    phases = [(0, "bsp", everyone), (1, "bsp", everyone), (2, "bsp", three), (3, "bsp", three)]
    phases += [(t, "asp", everyone) for t in range(4, steps)]
    want = out[0][0] - _sync_switch_oracle(n, lr, phases)
    for rank, (_, final, stats, computed) in enumerate(out):
        assert [(d["event"], d["step"], d["workers"]) for d in stats["detections"]] == [("removed", 2, [3])], stats
        assert [(s["to"], s["step"], s["final"]) for s in stats["switches"]] == [("asp", 4, True)]
        assert computed == ([0, 1] + list(range(4, steps)) if rank == 3 else list(range(steps)))
        torch.testing.assert_close(final, want)


def test_sync_switch_greedy_switches_to_asp_on_a_straggler_and_back_when_it_is_gone():
    """The same straggler (slow for its first 4 iterations): greedy switches everyone to ASP
    after the first window, back to BSP once a window passes without a straggler, and to ASP
    for good when the 4 BSP iterations are done. The detector also wants a straggler below
    half the median (``min_gap=0.5``, not the paper's rule, the default): the paper's rule
    alone flags noise among four equally fast workers (a window here times one iteration),
    and with it three runs of three stayed in ASP for want of a window without a straggler."""
    n, steps, lr = 4, 10, 0.1
    out = run_ranks(sync_switch_policy_run, steps, 0.4, "greedy", 0.5, nproc=n, timeout_s=90)
    everyone = list(range(n))
    bsp = {0, 1, 6, 7}
    phases = [(t, "bsp" if t in bsp else "asp", everyone) for t in range(steps)]
    want = out[0][0] - _sync_switch_oracle(n, lr, phases)
    for _, final, stats, computed in out:
        assert [(s["to"], s["step"], s["final"]) for s in stats["switches"]] == [
            ("asp", 2, False), ("bsp", 6, False), ("asp", 8, True)], stats
        assert [d["event"] for d in stats["detections"]] == ["straggler", "straggler-free"]
        assert stats["bsp_iterations"] == 4 and computed == list(range(steps))
        torch.testing.assert_close(final, want)
