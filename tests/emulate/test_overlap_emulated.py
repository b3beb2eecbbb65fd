"""``dssync bench overlap``'s runner on a real emulated network: both modes train, and
compute the same thing (the oracle: overlapped averaging is the after-step arithmetic)."""

import pytest

from dssync.bench.overlap import compare_overlap

pytestmark = pytest.mark.emulate


def test_both_modes_train_on_the_emulated_network_to_the_same_model(name):
    record = compare_overlap([2, 2], nic="200mbit", uplink="200mbit", task="digits", steps=30,
                             batch_size=32, bucket_mb=0.0, reps=1, name=name)
    assert [r["mode"] for r in record["runs"]] == ["after-step", "overlap"]
    after, overlap = (record["median_final_accuracy"][m] for m in ("after-step", "overlap"))
    assert after > 0.5  # digits from chance (0.1) in 30 steps
    assert overlap == pytest.approx(after, abs=0.01)
    assert record["ratio"] > 0 and record["network"]["nic"] == "200mbit"
