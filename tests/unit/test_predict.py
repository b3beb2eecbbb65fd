"""``bench predict``'s inputs: iterations to target from compare records, contended racks."""

import pytest

from dssync.bench.predict import contended_racks, iterations_factors


def _run(strategy, scenario, accuracies, every=10):
    curve = [{"step": every * (i + 1), "accuracy": a} for i, a in enumerate(accuracies)]
    return {"strategy": strategy, "scenario": scenario, "curve": curve, "best_accuracy": max(accuracies)}


def test_factors_use_each_scenarios_lowest_reference_best_and_count_a_miss_as_never():
    records = [
        _run("ddp", "a", [0.5, 0.9, 0.95]),     # best 0.95
        _run("ddp", "a", [0.5, 0.92, 0.93]),    # best 0.93: scenario a's target; reached at 30 and 20
        _run("ddp", "b", [0.8, 0.8, 0.8, 0.9]),  # target 0.9, reached at 40
        _run("fast", "a", [0.94, 0.94]),        # 10
        _run("fast", "b", [0.7, 0.9]),          # 20
        _run("fast", "b", [0.7, 0.7]),          # never
        _run("never", "a", [0.1, 0.2]),
        _run("mostly-not", "a", [0.94]),        # 10
        _run("mostly-not", "a", [0.5]),
        _run("mostly-not", "b", [0.5]),
    ]
    got = iterations_factors(records)
    # ddp: 30, 20 and 40 -> median 30
    assert got["ddp"] == {"reached": 3, "runs": 3, "iterations": 30, "factor": 1.0}
    # fast: 10, 20 and never -> median 20
    assert got["fast"] == {"reached": 2, "runs": 3, "iterations": 20, "factor": pytest.approx(2 / 3)}
    assert got["never"] == {"reached": 0, "runs": 1, "iterations": None, "factor": None}
    assert got["mostly-not"] == {"reached": 1, "runs": 3, "iterations": None, "factor": None}


def test_a_record_without_the_reference_is_refused():
    with pytest.raises(ValueError, match="no ddp runs"):
        iterations_factors([_run("gossip", "a", [0.5])])


@pytest.mark.parametrize(("racks", "fraction", "want"), [
    (8, 0.0, []), (8, 0.25, [0, 4]), (4, 1.0, [0, 1, 2, 3]), (512, 0.25, list(range(0, 512, 4))), (3, 0.5, [0, 1]),
])
def test_contended_racks_are_spread_evenly(racks, fraction, want):
    assert contended_racks(racks, fraction) == want
