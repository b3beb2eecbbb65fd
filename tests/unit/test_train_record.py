"""A diverged run's record: strict JSON cannot hold its NaN loss, and the run is not lost."""

import json
import math

from dssync._jsonfile import write_json
from dssync.commands.train import finite_record


def test_a_diverged_runs_record_is_written_with_null_losses_and_says_it_diverged(tmp_path):
    record = {"strategy": "asp", "best_accuracy": 0.21, "final_loss": float("nan"),
              "curve": [{"step": 0, "accuracy": 0.2, "loss": 4.1}, {"step": 50, "accuracy": 0.21, "loss": float("inf")}],
              "per_rank": [1.0, -math.inf]}
    out = finite_record(record)
    write_json(tmp_path / "r.json", out)  # strict JSON: raises on any NaN left
    back = json.loads((tmp_path / "r.json").read_text())
    assert back["diverged"] is True and back["final_loss"] is None and back["per_rank"] == [1.0, None]
    assert [c["loss"] for c in back["curve"]] == [4.1, None] and [c["accuracy"] for c in back["curve"]] == [0.2, 0.21]
    assert back["best_accuracy"] == 0.21 and math.isnan(record["final_loss"])  # the caller's record untouched


def test_a_finite_record_is_unchanged():
    record = {"strategy": "ddp", "best_accuracy": 0.5, "curve": [{"step": 0, "accuracy": 0.5, "loss": 1.0}]}
    assert finite_record(record) == record and "diverged" not in finite_record(record)
