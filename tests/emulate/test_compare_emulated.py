"""``bench compare`` on a real emulated network, with an oracle: hierarchical averages exactly
allreduce's gradient, so from the same seed both train the same model."""

import pytest

from dssync.bench.compare import compare, summarize

pytestmark = pytest.mark.emulate


def test_compare_runs_every_strategy_on_the_scenario_and_hierarchical_matches_allreduce(name):
    records = compare(["inter-rack"], ["allreduce", "hierarchical"], task="digits", steps=30, eval_every=15,
                      name=name)
    assert [(r["scenario"], r["strategy"]) for r in records] == [("inter-rack", "allreduce"),
                                                                ("inter-rack", "hierarchical")]
    ar, hier = records
    assert ar["final_accuracy"] > 0.5
    assert [c["accuracy"] for c in hier["curve"]] == pytest.approx([c["accuracy"] for c in ar["curve"]], abs=0.005)
    rows = summarize(records)
    assert rows[0]["target_accuracy"] == ar["best_accuracy"] and rows[0]["comm_ms_per_iter"] > 0


def test_simcheck_measures_the_shaped_network_the_simulator_models(name):
    # 2 MB over 1 Gbit/s: a pair swap needs 16 ms, so an unshaped (multi-Gbit/s) veth
    # would measure several times faster than the simulator's bound-plus-latency figure.
    from dssync.bench.simcheck import simcheck

    rows = simcheck(["inter-rack"], ["ds-sync"], model_mb=2.0, steps=12, warmup=2, name=name)
    (row,) = rows
    assert (row["scenario"], row["strategy"], len(row["comm_ms_samples"])) == ("inter-rack", "ds-sync", 12)
    assert row["measured_ms"] >= 0.5 * row["predicted_ms"] > 0
