"""Bad input to every subcommand and every file dssync reads, hand-picked and generated: each
case must end non-zero with one line on stderr, no traceback, and nothing written.

The cases run in-process through ``dssync.cli.main`` (what the ``dssync`` script calls), so a
few hundred of them cost seconds; ``test_cli.py`` runs the installed script itself. A case
that dssync wrongly accepts starts real work and fails here on its exit code or its files.
"""

import json
import os
from pathlib import Path

import pytest
from cli_runner import run_main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dssync import cli
from dssync.planning.planner import static_plan
from dssync.topology import Topology

TOPOLOGY = Topology.from_rack_sizes([2, 2]).to_dict()
SCHEDULE = static_plan(Topology.from_rack_sizes([2, 2])).to_dict()


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


def refused(argv: list[str], root: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run ``dssync argv`` in ``root``; assert it failed on one line and wrote nothing there."""
    monkeypatch.chdir(root)
    monkeypatch.setenv("DSSYNC_STATE_DIR", str(root / "state"))
    before = tree(root)
    proc = run_main([a.replace("{tmp}", str(root)) for a in argv], capsys, monkeypatch)
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code not in (0, None), (argv, out[-2000:], err[-2000:])
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert tree(root) == before, f"{argv} wrote {set(tree(root)) - set(before)}"
    return lines[0]


# -- files --------------------------------------------------------------------------------

def _with(base: dict, **changes) -> str:
    return json.dumps({**base, **changes})


def _workers(*pairs) -> list[dict]:
    return [{"rank": r, "rack": k} for r, k in pairs]


BAD_TOPOLOGIES = {
    "empty": "",
    "truncated": '{"version": 1, "workers": [',
    "a list": "[]",
    "null": "null",
    "a number": "42",
    "a string": '"topology"',
    "version 2": _with(TOPOLOGY, version=2),
    "version as text": _with(TOPOLOGY, version="1"),
    "version true": _with(TOPOLOGY, version=True),
    "no version": json.dumps({"workers": TOPOLOGY["workers"]}),
    "no workers": json.dumps({"version": 1}),
    "workers an object": _with(TOPOLOGY, workers={"0": 0}),
    "workers empty": _with(TOPOLOGY, workers=[], world_size=0),
    "worker a number": _with(TOPOLOGY, workers=[0, 1]),
    "worker without rank": _with(TOPOLOGY, workers=[{"rack": 0}]),
    "worker without rack": _with(TOPOLOGY, workers=[{"rank": 0}]),
    "rank as text": _with(TOPOLOGY, workers=[{"rank": "0", "rack": 0}]),
    "rack a float": _with(TOPOLOGY, workers=[{"rank": 0, "rack": 0.5}]),
    "rank true": _with(TOPOLOGY, workers=[{"rank": True, "rack": 0}]),
    "negative rank": _with(TOPOLOGY, workers=_workers((-1, 0), (0, 0)), world_size=2),
    "duplicate rank": _with(TOPOLOGY, workers=_workers((0, 0), (0, 0)), world_size=2),
    "missing rank": _with(TOPOLOGY, workers=_workers((0, 0), (2, 0)), world_size=2),
    "racks out of order": _with(TOPOLOGY, workers=_workers((0, 1), (1, 0)), world_size=2),
    "rack numbers skip": _with(TOPOLOGY, workers=_workers((0, 0), (1, 2)), world_size=2),
    "world size mismatch": _with(TOPOLOGY, world_size=5),
    "contention a list": _with(TOPOLOGY, contention=[]),
    "uplinks an object": _with(TOPOLOGY, contention={"uplinks": {"rack": 0}}),
    "uplink a string": _with(TOPOLOGY, contention={"uplinks": ["0"]}),
    "uplink without rack": _with(TOPOLOGY, contention={"uplinks": [{"bandwidth_gbps": 1}]}),
    "uplink an integer": _with(TOPOLOGY, contention={"uplinks": [0]}),
    "uplink rack out of range": _with(TOPOLOGY, contention={"uplinks": [{"rack": 9}]}),
    "nic rank out of range": _with(TOPOLOGY, contention={"nics": [{"rank": 4}]}),
    "nic rank true": _with(TOPOLOGY, contention={"nics": [{"rank": True}]}),
    "latency not square": _with(TOPOLOGY, latency_us=[[0, 1], [1, 0]]),
    "latency with text": _with(TOPOLOGY, latency_us=[["a"] * 4] * 4),
    "latency ragged": _with(TOPOLOGY, latency_us=[[0, 1, 2, 3], [0]] * 2),
    "bandwidth negative": _with(TOPOLOGY, bandwidth_gbps=[[-1.0] * 4] * 4),
    "bandwidth past the float range": _with(TOPOLOGY, bandwidth_gbps=[[1.0] * 4] * 3).replace("]]", "], [1e400, 1, 1, 1]]"),
    "NaN literal": _with(TOPOLOGY, latency_us=[[0.0] * 4] * 4).replace("0.0", "NaN", 1),
    "Infinity literal": _with(TOPOLOGY, latency_us=[[0.0] * 4] * 4).replace("0.0", "Infinity", 1),
    "confidence a list": _with(TOPOLOGY, confidence=[]),
    "deeply nested": "[" * 100000 + "]" * 100000,
    "not UTF-8": b'{"version": 1, "workers": "\xff\xfe"}',
}

BAD_SCHEDULES = {
    "empty": "",
    "version 3": _with(SCHEDULE, version=3),
    "version true": _with(SCHEDULE, version=True),
    "period a string": _with(SCHEDULE, period="x"),
    "period empty": _with(SCHEDULE, period=[]),
    "round not a list": _with(SCHEDULE, period=[0]),
    "group with text": _with(SCHEDULE, period=[[[0, "1"], [2, 3]]]),
    "group with true": _with(SCHEDULE, period=[[[True, 1], [2, 3]]]),
    "empty group": _with(SCHEDULE, period=[[[0, 1, 2, 3], []]]),
    "rank twice": _with(SCHEDULE, period=[[[0, 1], [1, 2, 3]]]),
    "rank missing": _with(SCHEDULE, period=[[[0, 1], [2]]]),
    "rank out of range": _with(SCHEDULE, period=[[[0, 1, 2, 3, 4]]]),
    "negative rank": _with(SCHEDULE, period=[[[-1, 0, 1, 2, 3]]]),
    "does not mix": _with(SCHEDULE, period=[[[0, 1], [2, 3]]]),
    "rho wrong": _with(SCHEDULE, rho=0.5),
    "rho a list": _with(SCHEDULE, rho=[0.5]),
    "rho NaN": _with(SCHEDULE, rho=0).replace('"rho": 0', '"rho": NaN'),
    "predicted a list": _with(SCHEDULE, predicted_comm_ms=[1]),
    "predicted Infinity": _with(SCHEDULE, predicted_comm_ms=0).replace('"predicted_comm_ms": 0', '"predicted_comm_ms": Infinity'),
    "notes a string": _with(SCHEDULE, notes="a note"),
    "notes with a number": _with(SCHEDULE, notes=[1]),
    "world size text": _with(SCHEDULE, world_size="4"),
    "world size zero": _with(SCHEDULE, world_size=0),
    "world size huge": _with(SCHEDULE, world_size=10**12),
    "world size of another job": _with(static_plan(Topology.from_rack_sizes([3, 2])).to_dict()),
    "compact without blocks": json.dumps({"version": 2, "world_size": 4, "rounds": [[[0, 2]]]}),
    "compact blocks overlap": json.dumps({"version": 2, "world_size": 4, "blocks": [[0, 1], [1, 2, 3]],
                                          "rounds": [[[0, 2]]]}),
    "compact rank twice": json.dumps({"version": 2, "world_size": 4, "blocks": [[0, 1], [2, 3]],
                                      "rounds": [[[0, 2], [2, 3]]]}),
    "compact out of range": json.dumps({"version": 2, "world_size": 4, "blocks": [[0, 1], [2, 3]],
                                        "rounds": [[[0, 9]]]}),
    "compact rounds a dict": json.dumps({"version": 2, "world_size": 4, "blocks": [[0, 1], [2, 3]],
                                         "rounds": {"0": []}}),
    "deeply nested": '{"version": 1, "period": ' + "[" * 100000 + "]" * 100000 + "}",
}


def _file(root: Path, content: str | bytes, name: str) -> str:
    path = root / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


TOPOLOGY_READERS = {
    "plan": lambda f: ["plan", f, "--out", "{tmp}/schedule.json"],
    "train": lambda f: ["train", "--strategy", "ds-sync", "--nproc", "2", "--steps", "1", "--topology", f, "--json", "{tmp}/run.json"],
}
SCHEDULE_READERS = {
    "train": lambda f: ["train", "--strategy", "ds-sync", "--nproc", "4", "--steps", "1", "--rack-sizes", "2,2", "--schedule", f,
                        "--json", "{tmp}/run.json"],
    "bench allreduce": lambda f: ["bench", "allreduce", "--nproc", "4", "--groups", f, "--sizes", "1KB",
                                  "--json", "{tmp}/bench.json"],
}


@pytest.mark.parametrize("reader", list(TOPOLOGY_READERS))
@pytest.mark.parametrize("case", list(BAD_TOPOLOGIES))
def test_malformed_topology_files(case, reader, tmp_path, capsys, monkeypatch):
    path = _file(tmp_path, BAD_TOPOLOGIES[case], "topology.json")
    line = refused(TOPOLOGY_READERS[reader](path), tmp_path, capsys, monkeypatch)
    assert "topology" in line, line


@pytest.mark.parametrize("reader", list(SCHEDULE_READERS))
@pytest.mark.parametrize("case", list(BAD_SCHEDULES))
def test_malformed_schedule_files(case, reader, tmp_path, capsys, monkeypatch):
    path = _file(tmp_path, BAD_SCHEDULES[case], "schedule.json")
    line = refused(SCHEDULE_READERS[reader](path), tmp_path, capsys, monkeypatch)
    assert "schedule" in line, line


@pytest.mark.parametrize("kind", ["missing", "a folder", "a FIFO", "/dev/zero", "/dev/null"])
@pytest.mark.parametrize("reader", ["topology", "schedule"])
def test_files_that_are_not_regular_files(kind, reader, tmp_path, capsys, monkeypatch):
    path = {"missing": str(tmp_path / "nothing.json"), "a folder": str(tmp_path / "folder"),
            "a FIFO": str(tmp_path / "fifo"), "/dev/zero": "/dev/zero", "/dev/null": "/dev/null"}[kind]
    if kind == "a folder":
        os.mkdir(path)
    if kind == "a FIFO":
        os.mkfifo(path)
    argv = (TOPOLOGY_READERS["plan"] if reader == "topology" else SCHEDULE_READERS["train"])(path)
    refused(argv, tmp_path, capsys, monkeypatch)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.recursive(st.none() | st.booleans() | st.integers(-2, 10**20) | st.floats(allow_nan=False) | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12),
       key=st.sampled_from(["workers", "contention", "latency_us", "world_size", "version"]))
def test_generated_topology_fields(value, key, tmp_path_factory, capsys, monkeypatch):
    """Any JSON value in one field of a valid topology: it plans (exit 0) or is refused on
    one line; never a traceback."""
    root = tmp_path_factory.mktemp("topo")
    path = _file(root, json.dumps({**TOPOLOGY, key: value}), "topology.json")
    monkeypatch.setattr(cli, "raise_on_sigterm", lambda: None)
    monkeypatch.chdir(root)
    capsys.readouterr()
    try:
        code = cli.main(["plan", path, "--out", str(root / "schedule.json")])
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    if code:
        assert len(err.strip().splitlines()) == 1, err
        assert not (root / "schedule.json").exists()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.recursive(st.none() | st.booleans() | st.integers(-2, 10**20) | st.floats(allow_nan=False) | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12),
       key=st.sampled_from(["period", "world_size", "rho", "notes", "predicted_comm_ms", "blocks", "rounds"]))
def test_generated_schedule_fields(value, key, tmp_path_factory, capsys, monkeypatch):
    """Any JSON value in one field of a valid schedule, loaded the way train loads it."""
    from dssync.errors import ScheduleError
    from dssync.planning.schedule import Schedule

    root = tmp_path_factory.mktemp("sched")
    path = _file(root, json.dumps({**SCHEDULE, key: value}), "schedule.json")
    try:
        Schedule.load(path)
    except ScheduleError as exc:
        assert len(str(exc).splitlines()) == 1, exc


# -- flags --------------------------------------------------------------------------------

TRAIN = ["train", "--strategy", "ds-sync", "--nproc", "2", "--steps", "2"]
BAD_FLAGS = {
    "train --steps 0": [*TRAIN, "--steps", "0"],
    "train --steps -1": [*TRAIN, "--steps", "-1"],
    "train --steps 1.5": [*TRAIN, "--steps", "1.5"],
    "train --lr nan": [*TRAIN, "--lr", "nan"],
    "train --lr -inf": [*TRAIN, "--lr", "-inf"],
    "train --lr 0": [*TRAIN, "--lr", "0"],
    "train --batch-size 0": [*TRAIN, "--batch-size", "0"],
    "train --nproc -2": ["train", "--strategy", "ds-sync", "--nproc", "-2"],
    "train --seed x": [*TRAIN, "--seed", "x"],
    "train --strategy nope": [*TRAIN, "--strategy", "nope"],
    "train --task nope": [*TRAIN, "--task", "nope"],
    "train --backend nope": [*TRAIN, "--backend", "nope"],
    "train --timeout 0": [*TRAIN, "--timeout", "0"],
    "train --timeout inf": [*TRAIN, "--timeout", "inf"],
    "train --ema-decay 1.5": [*TRAIN, "--ema-decay", "1.5"],
    "train --ema-decay nan": [*TRAIN, "--ema-decay", "nan"],
    "train --swa-start -1": [*TRAIN, "--swa-start", "-1"],
    "train --model-mb -1": [*TRAIN, "--model-mb", "-1"],
    "train --bucket-mb -1": [*TRAIN, "--bucket-mb", "-1", "--overlap"],
    "train --adjust-every 0": [*TRAIN, "--adjust-every", "0"],
    "train --max-pace 0": [*TRAIN, "--max-pace", "0"],
    "train --set without =": [*TRAIN, "--set", "lr"],
    "train --set unknown": [*TRAIN, "--strategy", "psp", "--set", "nope=1"],
    "train --set inf": [*TRAIN, "--strategy", "psp", "--set", "delay_s=inf"],
    "train --set text": [*TRAIN, "--strategy", "ssp", "--set", "staleness=abc"],
    "train --set tau1_s=nan": [*TRAIN, "--strategy", "psp", "--set", "tau1_s=nan"],
    "train --set delay_s=-1": [*TRAIN, "--strategy", "psp", "--set", "delay_s=-1"],
    "train --warmup-steps -1": [*TRAIN, "--warmup-steps", "-1"],
    "train --eval-every 0": [*TRAIN, "--eval-every", "0"],
    "train --target-accuracy 2": [*TRAIN, "--target-accuracy", "2"],
    "train --target-accuracy nan": [*TRAIN, "--target-accuracy", "nan"],
    "train --lr-schedule nope": [*TRAIN, "--lr-schedule", "nope"],
    "train --checkpoint-every -1": [*TRAIN, "--checkpoint", "{tmp}/ck", "--checkpoint-every", "-1"],
    "train --checkpoint into a file": [*TRAIN, "--checkpoint", "{tmp}/file.txt"],
    "train --json into a missing folder": [*TRAIN, "--json", "{tmp}/no/run.json"],
    "train --device tpu": [*TRAIN, "--device", "tpu"],
    "train --rack-sizes 0": [*TRAIN, "--rack-sizes", "0"],
    "train --rack-sizes a,b": [*TRAIN, "--rack-sizes", "a,b"],
    "train --rack-sizes too many": [*TRAIN, "--rack-sizes", "2,2"],
    "train --topology and --rack-sizes": [*TRAIN, "--rack-sizes", "1,1", "--topology", "{tmp}/t.json"],
    "train --racks 5 for 2 ranks": [*TRAIN, "--racks", "5"],
    "train unknown flag": [*TRAIN, "--bogus"],
    "plan neither": ["plan", "--out", "{tmp}/s.json"],
    "plan both": ["plan", "{tmp}/t.json", "--rack-sizes", "2,2", "--out", "{tmp}/s.json"],
    "plan --racks alone": ["plan", "--racks", "2", "--out", "{tmp}/s.json"],
    "plan --racks 0": ["plan", "--racks", "0", "--workers-per-rack", "2", "--out", "{tmp}/s.json"],
    "plan --racks and --rack-sizes": ["plan", "--racks", "2", "--workers-per-rack", "2", "--rack-sizes", "2,2",
                                      "--out", "{tmp}/s.json"],
    "plan --slow-uplinks x": ["plan", "--rack-sizes", "2,2", "--slow-uplinks", "x", "--out", "{tmp}/s.json"],
    "plan --slow-uplinks 5": ["plan", "--rack-sizes", "2,2", "--slow-uplinks", "5", "--out", "{tmp}/s.json"],
    "plan --slow-nics 99": ["plan", "--rack-sizes", "2,2", "--slow-nics", "99", "--out", "{tmp}/s.json"],
    "plan --slow-nics -1": ["plan", "--rack-sizes", "2,2", "--slow-nics=-1", "--out", "{tmp}/s.json"],
    "plan --max-period 0": ["plan", "--rack-sizes", "2,2", "--max-period", "0", "--out", "{tmp}/s.json"],
    "plan --pace 65": ["plan", "--rack-sizes", "2,2", "--pace", "65", "--out", "{tmp}/s.json"],
    "plan --message-mb -1": ["plan", "--rack-sizes", "2,2", "--message-mb", "-1", "--out", "{tmp}/s.json"],
    "plan --out into a missing folder": ["plan", "--rack-sizes", "2,2", "--out", "{tmp}/no/s.json"],
    "plan --out a folder": ["plan", "--rack-sizes", "2,2", "--out", "{tmp}"],
    "plan no --out": ["plan", "--rack-sizes", "2,2"],
    "probe --message-mb 0": ["probe", "--message-mb", "0", "--out", "{tmp}/t.json"],
    "probe --bandwidth-seconds -1": ["probe", "--bandwidth-seconds", "-1", "--out", "{tmp}/t.json"],
    "probe --latency-reps 0": ["probe", "--latency-reps", "0", "--out", "{tmp}/t.json"],
    "probe --timeout nan": ["probe", "--timeout", "nan", "--out", "{tmp}/t.json"],
    "probe --plot a jpg": ["probe", "--plot", "{tmp}/p.jpg", "--out", "{tmp}/t.json"],
    "probe --out into a missing folder": ["probe", "--out", "{tmp}/no/t.json"],
    "probe --nproc 0": ["probe", "--nproc", "0", "--out", "{tmp}/t.json"],
    "probe --backend nope": ["probe", "--backend", "nope", "--out", "{tmp}/t.json"],
    "probe --rack-sizes for another world": ["probe", "--nproc", "2", "--rack-sizes", "3,3", "--out", "{tmp}/t.json"],
    "simulate --racks 0": ["simulate", "--racks", "0", "--workers-per-rack", "2"],
    "simulate --workers-per-rack 0": ["simulate", "--racks", "2", "--workers-per-rack", "0"],
    "simulate --iterations 0": ["simulate", "--rack-sizes", "2,2", "--iterations", "0"],
    "simulate --size-mb nan": ["simulate", "--rack-sizes", "2,2", "--size-mb", "nan"],
    "simulate --strategies nope": ["simulate", "--rack-sizes", "2,2", "--strategies", "nope"],
    "simulate --scenario nope": ["simulate", "--scenario", "nope"],
    "simulate --nic fast": ["simulate", "--rack-sizes", "2,2", "--nic", "fast"],
    "simulate --alpha-us -1": ["simulate", "--rack-sizes", "2,2", "--alpha-us", "-1"],
    "simulate --json into a missing folder": ["simulate", "--rack-sizes", "2,2", "--json", "{tmp}/no/s.json"],
    "simulate --contended-uplinks 2": ["simulate", "--rack-sizes", "2,2", "--contended-uplinks", "2"],
    "simulate --efficiency 0": ["simulate", "--rack-sizes", "2,2", "--efficiency", "0"],
    "simulate --compute-ms -1": ["simulate", "--rack-sizes", "2,2", "--compute-ms", "-1"],
    "bench allreduce --sizes 0": ["bench", "allreduce", "--nproc", "2", "--sizes", "0"],
    "bench allreduce --iters 0": ["bench", "allreduce", "--nproc", "2", "--iters", "0"],
    "bench allreduce --factor 1": ["bench", "allreduce", "--nproc", "2", "--factor", "1"],
    "bench allreduce --nproc 0": ["bench", "allreduce", "--nproc", "0"],
    "bench allreduce --backend nope": ["bench", "allreduce", "--backend", "nope"],
    "bench allreduce --json into a missing folder": ["bench", "allreduce", "--nproc", "2", "--json", "{tmp}/no/b.json"],
    "bench ensemble --seeds 0": ["bench", "ensemble", "--seeds", "0"],
    "bench ensemble --rules nope": ["bench", "ensemble", "--rules", "nope"],
    "bench averaging --trials 0": ["bench", "averaging", "--trials", "0"],
    "bench averaging --size-mb -1": ["bench", "averaging", "--size-mb", "-1"],
    "bench compare --scenario nope": ["bench", "compare", "--scenario", "nope"],
    "bench compare --steps 0": ["bench", "compare", "--steps", "0"],
    "bench compare --strategies nope": ["bench", "compare", "--strategies", "nope"],
    "bench compare --json into a missing folder": ["bench", "compare", "--json", "{tmp}/no/c.json"],
    "bench compare --seeds x": ["bench", "compare", "--seeds", "1,x"],
    "bench compare --seeds twice": ["bench", "compare", "--seeds", "1,1"],
    "bench compare --rate-scale 0": ["bench", "compare", "--rate-scale", "0"],
    "bench compare --optimizer nope": ["bench", "compare", "--optimizer", "nope"],
    "bench compare a variant's bad train option": ["bench", "compare", "--strategies", "ddp,diloco:--optimiser=adamw"],
    "bench compare --resume without --json": ["bench", "compare", "--resume"],
    "bench compare --resume a record of another bench": ["bench", "compare", "--resume", "--json",
                                                         "{tmp}/not-a-record.json"],
    "bench compare --resume a file that is not JSON": ["bench", "compare", "--resume", "--json", "{tmp}/file.txt"],
    "bench compare --tuned missing": ["bench", "compare", "--tuned", "{tmp}/none.json"],
    "bench compare --tuned of another bench": ["bench", "compare", "--tuned", "{tmp}/not-a-record.json"],
    "bench tune a missing sweep": ["bench", "tune", "{tmp}/none.json"],
    "bench tune a sweep without ddp's times": ["bench", "tune", "{tmp}/not-a-record.json"],
    "bench tune a file that is not JSON": ["bench", "tune", "{tmp}/file.txt"],
    "bench simcheck --rate-scale 0": ["bench", "simcheck", "--rate-scale", "0"],
    "bench simcheck --strategies nope": ["bench", "simcheck", "--strategies", "nope"],
    "bench simcheck --seeds 0": ["bench", "simcheck", "--seeds", "0"],
    "bench simcheck --from a missing record": ["bench", "simcheck", "--from", "{tmp}/none.json"],
    "bench simcheck --from a record of another bench": ["bench", "simcheck", "--from", "{tmp}/not-a-record.json"],
    "bench predict --racks 0": ["bench", "predict", "--racks", "0"],
    "bench predict --contended 1.5": ["bench", "predict", "--contended", "1.5"],
    "bench predict --strategies without ddp": ["bench", "predict", "--strategies", "gossip"],
    "bench predict --simcheck missing": ["bench", "predict", "--simcheck", "{tmp}/none.json"],
    "bench predict --compare of another bench": ["bench", "predict", "--compare", "{tmp}/not-a-record.json"],
    "bench predict --plot into a missing folder": ["bench", "predict", "--plot", "{tmp}/no/p.png"],
    "bench overlap --reps 0": ["bench", "overlap", "--reps", "0"],
    "bench probe-backends --seconds 0": ["bench", "probe-backends", "--seconds", "0"],
    "bench probe-layouts --count 0": ["bench", "probe-layouts", "--count", "0"],
    "bench probe-layouts --max-workers 1": ["bench", "probe-layouts", "--max-workers", "1"],
    "bench probe-layouts --rate-scale 0": ["bench", "probe-layouts", "--rate-scale", "0"],
    "bench probe-layouts --rate-scale 2": ["bench", "probe-layouts", "--rate-scale", "2"],
    "bench probe-layouts --layout a rack it lacks": ["bench", "probe-layouts", "--layout", "2,2 rack:2"],
    "bench probe-layouts --layout unreadable": ["bench", "probe-layouts", "--layout", "two racks"],
    "bench probe-layouts --built-once without --layout": ["bench", "probe-layouts", "--built-once"],
    "bench nothing": ["bench"],
    "bench nope": ["bench", "nope"],
    "emulate up --rack-sizes 0": ["emulate", "up", "--rack-sizes", "0"],
    "emulate up --name ../x": ["emulate", "up", "--rack-sizes", "2,2", "--name", "../x"],
    "emulate up --name UPPER": ["emulate", "up", "--rack-sizes", "2,2", "--name", "UPPER"],
    "emulate up --name too long": ["emulate", "up", "--rack-sizes", "2,2", "--name", "a" * 13],
    "emulate up --nic fast": ["emulate", "up", "--rack-sizes", "2,2", "--nic", "fast", "--name", "fz"],
    "emulate up --latency -1ms": ["emulate", "up", "--rack-sizes", "2,2", "--latency", "-1ms", "--name", "fz"],
    "emulate up --scenario nope": ["emulate", "up", "--scenario", "nope", "--name", "fz"],
    "emulate contend --name x/y": ["emulate", "contend", "--name", "x/y", "--flows", "rack:0"],
    "emulate contend --streams 0": ["emulate", "contend", "--name", "fz", "--flows", "rack:0", "--streams", "0"],
    "emulate run --timeout nan": ["emulate", "run", "--name", "fz", "--timeout", "nan", "--", "true"],
    "emulate run --timeout 0": ["emulate", "run", "--name", "fz", "--timeout", "0", "--", "true"],
    "emulate run --name bad!": ["emulate", "run", "--name", "bad!", "--", "true"],
    "emulate run no cluster": ["emulate", "run", "--name", "fznone", "--", "true"],
    "emulate down --name x/../..": ["emulate", "down", "--name", "x/../.."],
    "emulate run --episode unreadable": ["emulate", "run", "--name", "fz", "--episode", "rank 1 slow", "--", "true"],
    "emulate run --episode past the float range": ["emulate", "run", "--name", "fz", "--episode",
                                                   "1:cpu=0.5@" + "9" * 400 + "+5", "--", "true"],
    "emulate run --episode a year long": ["emulate", "run", "--name", "fz", "--episode", "1:cpu=0.5@1+40000000",
                                          "--", "true"],
    "emulate run --episode lasting 0 s": ["emulate", "run", "--name", "fz", "--episode", "1:cpu=0.5@1+0", "--", "true"],
    "emulate run --episode cpu 0": ["emulate", "run", "--name", "fz", "--episode", "1:cpu=0@1+5", "--", "true"],
    "emulate run --episode nic fast": ["emulate", "run", "--name", "fz", "--episode", "1:nic=fast@1+5", "--", "true"],
    "emulate run --episode delay soon": ["emulate", "run", "--name", "fz", "--episode", "1:delay=soon@1+5", "--",
                                         "true"],
    "emulate nope": ["emulate", "nope"],
    "tune sync-switch --steps 0": ["tune", "sync-switch", "--steps", "0"],
    "tune sync-switch --beta 2": ["tune", "sync-switch", "--beta", "2"],
    "tune sync-switch --reuse a missing file": ["tune", "sync-switch", "--reuse", "{tmp}/none.json"],
    "tune sync-switch --out into a missing folder": ["tune", "sync-switch", "--out", "{tmp}/no/p.json"],
    "train --optimizer nope": ["train", "--strategy", "ddp", "--optimizer", "nope"],
    "train --weight-decay -1": ["train", "--strategy", "ddp", "--weight-decay", "-1"],
    "train gossip period 0": ["train", "--strategy", "gossip", "--set", "period=0"],
    "demo --steps 0": ["demo", "--steps", "0"],
    "demo --nproc 0": ["demo", "--nproc", "0"],
    "no command": [],
    "unknown command": ["nope"],
}


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_bad_flags(case, tmp_path, capsys, monkeypatch):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "t.json").write_text(json.dumps(TOPOLOGY))
    (tmp_path / "not-a-record.json").write_text(json.dumps([{"strategy": "ddp"}]))
    refused(BAD_FLAGS[case], tmp_path, capsys, monkeypatch)
