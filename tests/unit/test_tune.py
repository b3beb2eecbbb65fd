"""Sync-Switch's binary search for the switch point, on accuracies worked out by hand."""

import pytest

from dssync.training.tune import search_switch_point


def knee(at: float):
    """Accuracy 0.95 from ``at`` of the workload on BSP up, 0.80 below: the paper's knee."""
    calls = []

    def run(s: float, repeat: int) -> float:
        calls.append((s, repeat))
        return 0.95 if s >= at else 0.80
    return run, calls


def test_the_search_bisects_towards_the_earliest_switch_that_keeps_bsps_accuracy():
    run, calls = knee(0.3)
    policy = search_switch_point(run, beta=0.01, settings=4)
    # BSP (1.0) sets the target; then 0.5 ok -> 0.25 too early -> 0.375 ok -> 0.3125 ok.
    assert [s for s, _ in calls] == [1.0, 0.5, 0.25, 0.375, 0.3125]
    assert policy["switch_at"] == 0.3125 and policy["target_accuracy"] == 0.95
    assert [t["accuracy"] for t in policy["trials"]] == [0.95, 0.95, 0.80, 0.95, 0.95]


def test_repeats_average_per_setting_and_a_recurring_job_runs_no_bsp_trials():
    accuracy = {0.5: [0.94, 0.90]}  # mean 0.92: outside 0.95 +- 0.01, although one run is inside

    def run(s: float, repeat: int) -> float:
        return accuracy.get(s, [0.95, 0.95])[repeat]
    policy = search_switch_point(run, beta=0.01, settings=2, repeats=2, target=0.95)
    assert [t["switch_at"] for t in policy["trials"]] == [0.5, 0.5, 0.75, 0.75]  # no 1.0: target given
    assert [t["repeat"] for t in policy["trials"]] == [0, 1, 0, 1]
    assert policy["switch_at"] == 0.75


def test_no_setting_that_meets_the_target_leaves_pure_bsp():
    policy = search_switch_point(lambda s, r: 0.5, beta=0.01, settings=3, target=0.95)
    assert policy["switch_at"] == 1.0


def test_bad_search_settings_are_refused():
    with pytest.raises(ValueError, match="settings, repeats >= 1"):
        search_switch_point(lambda s, r: 1.0, settings=0)
