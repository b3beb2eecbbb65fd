"""SpecSync's adaptive tuning (Algorithm 1) and its scheduler's timers, on synthetic push traces."""

import time

import numpy as np
import pytest

from dssync.ps.speculation import Scheduler, net_gain, tune


def brute_force_gain(delta, epoch, spans, m):
    """Eq. 7 by hand: for each start, the others' pushes in (t, t + delta], minus the loss."""
    total = 0.0
    for t, w in epoch:
        total += sum(1 for u, v in epoch if v != w and t < u <= t + delta)
        total -= (m - 1) * delta / spans[w]
    return total


def test_net_gain_counts_only_other_workers_in_the_half_open_window():
    epoch = [(0.0, 0), (1.0, 1), (1.5, 0), (2.0, 2)]
    spans = {0: 2.0, 1: 2.0, 2: 2.0}
    arrays = [np.array([t for t, _ in epoch]), np.array([w for _, w in epoch])]
    got = net_gain(1.0, arrays[0], arrays[1], np.array([2.0, 2.0, 2.0]), 3)
    # starts: 0.0 (w0) sees 1.0 (w1) -> 1; 1.0 (w1) sees 1.5 (w0), 2.0 (w2) -> 2; 1.5 (w0) sees 2.0 -> 1; 2.0 -> 0
    assert got == pytest.approx(4 - 4 * 2 * 1.0 / 2.0)
    assert got == pytest.approx(brute_force_gain(1.0, epoch, spans, 3))


@pytest.mark.parametrize("seed", range(20))
def test_tuning_finds_the_best_window_a_fine_grid_can_find(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(3, 9))
    spans = {w: float(rng.uniform(0.5, 3.0)) for w in range(m)}
    epoch = sorted((float(rng.uniform(0, 3)), int(rng.integers(0, m))) for _ in range(m))
    best = tune(epoch, spans, m)
    cap = 0.5 * np.mean(list(spans.values()))
    grid = [brute_force_gain(d, epoch, spans, m) for d in np.linspace(1e-6, cap, 4001)]
    # The gain is a step function of delta and the loss grows with it: the best delta is one of
    # the push spacings, so the candidates are never beaten by the grid.
    assert best.net_gain >= max(max(grid), 0.0) - 1e-9
    if best.abort_time_s > 0:
        assert 0 < best.abort_time_s <= cap
        assert best.net_gain == pytest.approx(brute_force_gain(best.abort_time_s, epoch, spans, m))
        mean_span = np.mean(list(spans.values()))
        assert best.abort_rate == pytest.approx(best.abort_time_s * (m - 1) / (mean_span * m))
    else:
        assert max(grid) <= 1e-9  # no window pays: do not speculate


def test_tuning_does_not_speculate_without_history_or_peers():
    assert tune([], {}, 4).abort_time_s == 0
    assert tune([(0.0, 0)], {0: 1.0}, 1).abort_time_s == 0


def test_a_slow_worker_among_bursty_fast_ones_gains_from_waiting():
    """Three fast workers push together just after the slow one starts: waiting that long
    uncovers three fresh updates for it, far more than its share of the loss."""
    m = 4
    epoch = [(0.0, 3), (0.05, 0), (0.06, 1), (0.07, 2)]
    spans = {0: 0.2, 1: 0.2, 2: 0.2, 3: 1.0}
    best = tune(epoch, spans, m)
    assert best.abort_time_s == pytest.approx(0.07)
    assert best.net_gain > 0


def _until_decided(sched: Scheduler, seconds: float = 10.0) -> None:
    """Until the scheduler has judged every window it was given (its timer thread pops a
    window and decides it in one hold of the lock), failing after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        with sched._lock:
            if not sched._timers:
                return
        assert time.monotonic() < deadline, f"the scheduler left windows undecided for {seconds:.0f} s"
        time.sleep(0.01)


def test_the_scheduler_re_syncs_once_when_the_others_pushed_in_the_window():
    sched = Scheduler(3, abort_time_s=0.05, abort_rate=1 / 3, secret=b"s" * 32)
    sent = []
    sched._send = lambda worker, op, iteration: sent.append((worker, iteration))  # no sockets in a unit test
    try:
        with sched._lock:
            now = time.monotonic()
            sched.notify(0, 5, now)          # worker 0 starts iteration 5
            sched.notify(1, 2, now + 0.01)   # worker 1 pushes inside worker 0's window
        _until_decided(sched)
        with sched._lock:
            sched.notify(2, 9, time.monotonic())  # nobody pushes in worker 2's window
        _until_decided(sched)
    finally:
        sched.close()
    assert (0, 5) in sent and (2, 9) not in sent
    assert sent.count((0, 5)) == 1

