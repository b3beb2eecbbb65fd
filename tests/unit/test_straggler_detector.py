"""Sync-Switch's online straggler detector."""

from dssync.strategies.sync_switch import below_mean_minus_std


def test_the_straggler_detector_flags_the_slow_worker_and_not_noise():
    assert below_mean_minus_std([100, 101, 99, 100, 10, 98, 102, 100], 0.2) == {4}
    assert below_mean_minus_std([100, 101, 99, 100, None, 98, 102, 100], 0.2) == set()  # worker 4 is out
    noise = [100, 103, 97, 101, 99, 104, 96, 100]
    assert below_mean_minus_std(noise, 0.0) == {2, 6}  # the paper's rule alone flags noise
    assert below_mean_minus_std(noise, 0.2) == set()
    assert below_mean_minus_std([None, 5.0]) == set()
