"""``bench compare`` on a real emulated network, with an oracle: ddp, allreduce and hierarchical
all take BSP's step (the mean gradient), so from the same seed they train the same model."""

import pytest

from dssync.bench.compare import compare, summarize

pytestmark = pytest.mark.emulate


def test_compare_runs_every_strategy_on_the_scenario_and_the_bsp_variants_agree(name):
    records = compare(["inter-rack"], ["ddp", "allreduce", "hierarchical"], task="digits", steps=30,
                      eval_every=15, name=name, stop=False)
    assert [(r["scenario"], r["strategy"]) for r in records] == [("inter-rack", "ddp"), ("inter-rack", "allreduce"),
                                                                ("inter-rack", "hierarchical")]
    ddp, ar, hier = records
    assert ddp["final_accuracy"] > 0.5
    for other in (ar, hier):
        assert [c["accuracy"] for c in other["curve"]] == pytest.approx([c["accuracy"] for c in ddp["curve"]],
                                                                        abs=0.005)
    rows = summarize(records, reference="ddp")
    assert all(r["target_accuracy"] == ddp["best_accuracy"] for r in rows) and rows[0]["comm_ms_per_iter"] > 0
    assert rows[0]["tta_ratio"] == 1.0


def test_simcheck_measures_the_shaped_network_the_simulator_models(name):
    # 2 MB over 1 Gbit/s: a pair swap needs 16 ms, so an unshaped (multi-Gbit/s) veth
    # would measure several times faster than the simulator's bound-plus-latency figure.
    from dssync.bench.simcheck import simcheck

    rows = simcheck(["inter-rack"], ["ds-sync"], model_mb=2.0, steps=12, warmup=2, name=name)
    (row,) = rows
    assert (row["scenario"], row["strategy"], len(row["comm_ms_samples"])) == ("inter-rack", "ds-sync", 12)
    assert row["measured_ms"] >= 0.5 * row["predicted_ms"] > 0
