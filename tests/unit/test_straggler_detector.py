"""Sync-Switch's online straggler detector."""

from dssync.strategies.sync_switch import SyncSwitchStrategy, below_mean_minus_std


def test_the_straggler_detector_flags_the_slow_worker_and_not_noise():
    assert below_mean_minus_std([100, 101, 99, 100, 10, 98, 102, 100], 0.2) == {4}
    assert below_mean_minus_std([100, 101, 99, 100, None, 98, 102, 100], 0.2) == set()  # worker 4 is out
    noise = [100, 103, 97, 101, 99, 104, 96, 100]
    assert below_mean_minus_std(noise, 0.0) == {2, 6}  # the paper's rule alone flags noise
    assert below_mean_minus_std(noise, 0.2) == set()
    assert below_mean_minus_std([None, 5.0]) == set()


def test_the_default_detector_is_the_papers_rule_and_flags_a_worker_less_than_twice_as_slow():
    """Below mean - std (population) and nothing else: a worker at 2/3 of the others' speed
    stands out (mean 95.75, std 11.3, bar 84.4); the median gap of 0.5, the earlier default,
    let it through."""
    default = SyncSwitchStrategy.Config().min_gap
    assert default == 0.0
    slow = [100, 101, 99, 100, 66, 98, 102, 100]
    assert below_mean_minus_std(slow, default) == below_mean_minus_std(slow) == {4}
    assert below_mean_minus_std(slow, 0.5) == set()
    assert below_mean_minus_std([100, 100, 100, 100]) == set()  # no spread, nobody below
