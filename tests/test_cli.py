"""The ``dssync`` command line, run as a user runs it: a subprocess, exit codes, stderr."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_main

from dssync.planning.schedule import Schedule
from dssync.topology import Topology


def dssync(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dssync.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def in_process(capsys, monkeypatch, *args):
    """``dssync args`` in this process (``cli_runner.run_main``); that a refusal at the shell
    is the same one line is ``test_a_refusal_at_the_shell_is_one_line``."""
    return run_main(list(args), capsys, monkeypatch)


def assert_one_line_error(proc, *needles):
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_plan_writes_a_schedule_that_loads(tmp_path, capsys, monkeypatch):
    topo = tmp_path / "topology.json"
    Topology.from_rack_sizes([5, 3]).save(topo)
    out = tmp_path / "schedule.json"
    proc = in_process(capsys, monkeypatch, "plan", topo, "--out", out, "--print")
    assert proc.returncode == 0, proc.stderr
    assert "inter-rack group" in proc.stdout and "period 15" in proc.stdout
    schedule = Schedule.load(out)
    assert schedule.world_size == 8 and len(schedule.period) == 15
    assert json.loads(out.read_text())["rho"] == pytest.approx(schedule.rho)


def test_plan_adjusts_for_the_contention_a_topology_records(tmp_path, capsys, monkeypatch):
    topo = tmp_path / "topology.json"
    data = Topology.from_rack_sizes([5, 3]).to_dict()
    data["contention"] = {"uplinks": [{"rack": 0, "bandwidth_gbps": 0.2}],
                          "nics": [{"rank": 4, "bandwidth_gbps": 0.3}]}
    topo.write_text(json.dumps(data))
    out = tmp_path / "schedule.json"
    proc = in_process(capsys, monkeypatch, "plan", topo, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "adjusted for slow uplinks [0] and NICs [4]" in proc.stdout
    schedule = Schedule.load(out)
    assert all(len(next(g for g in p if 4 in g)) == 2 for p in schedule.period)


def test_plan_from_rack_sizes_says_why_it_departs_from_the_paper(tmp_path, capsys, monkeypatch):
    out = tmp_path / "schedule.json"
    proc = in_process(capsys, monkeypatch, "plan", "--rack-sizes", "4,4", "--slow-nics", "1,2,3", "--plan", "adjusted",
                      "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "adjusted for slow uplinks [] and NICs [1, 2, 3]" in proc.stdout
    assert "note: rack 0: one clear NIC (0)" in proc.stdout
    saved = json.loads(out.read_text())
    assert saved["notes"] == list(Schedule.load(out).notes) and len(saved["notes"]) == 1
    # Left to choose, the planner keeps the static plan here (three slow NICs in a rack of four:
    # the adjusted plan pairs them in turn and mixes slowly), and says why.
    proc = in_process(capsys, monkeypatch, "plan", "--rack-sizes", "4,4", "--slow-nics", "1,2,3", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "static, which mixes sooner around slow uplinks [] and NICs [1, 2, 3]" in proc.stdout
    assert "note: the static plan, not the adjusted one" in proc.stdout
    assert len(json.loads(out.read_text())["notes"]) == 1
    assert_one_line_error(in_process(capsys, monkeypatch, "plan", "--out", out), "a topology file or --rack-sizes")
    assert_one_line_error(in_process(capsys, monkeypatch, "plan", "--rack-sizes", "4,4", "--slow-uplinks", "2", "--out", out),
                          "slow uplink of rack 2")


_TWO = '{"version": 1, "workers": [{"rank": 0, "rack": 0}, {"rank": 1, "rack": 1}], "contention": {}}'


@pytest.mark.parametrize(("content", "needle"), [
    ("{oops", "not valid JSON"),
    ('{"version": 1, "workers": [{"rank": 0, "rack": 0}, {"rank": 0, "rack": 0}]}', "duplicated ranks [0]"),
    ('{"version": 1, "workers": [{"rank": 1, "rack": 0}]}', "missing ranks [0]"),
    ('{"version": 7, "workers": []}', '"version": 7'),
    (_TWO.replace("{}", '{"uplinks": ["x"]}'), 'contention uplinks[0] must be an object with an integer "rack"'),
    (_TWO.replace("{}", '{"uplinks": [{}]}'), 'contention uplinks[0] must be an object with an integer "rack"'),
    (_TWO.replace("{}", '{"uplinks": [{"rack": 5}]}'), 'contention uplinks[0] must be an object'),
    (_TWO.replace("{}", '{"nics": [3]}'), 'contention nics[0] must be an object with an integer "rank"'),
    (_TWO.replace("{}", '{"nics": "all"}'), 'contention "nics" must be a list'),
    ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
    ('{"version": 1, "world_size": NaN, "workers": []}', "NaN is not a number strict JSON allows"),
    ('{"version": 1, "world_size": Infinity, "workers": []}', "Infinity is not a number"),
    (b"\xff\xfe{", "is not UTF-8 text"),
    ("fifo", "is not a regular file"),
])
def test_plan_rejects_malformed_topologies(tmp_path, content, needle, capsys, monkeypatch):
    topo = tmp_path / "topology.json"
    if content == "fifo":  # reading it would block for ever
        os.mkfifo(topo)
    elif isinstance(content, bytes):
        topo.write_bytes(content)
    else:
        topo.write_text(content)
    out = tmp_path / "schedule.json"
    assert_one_line_error(in_process(capsys, monkeypatch, "plan", topo, "--out", out), needle, str(topo))
    assert not out.exists()  # nothing half-written


def test_train_rejects_bad_input_before_starting_ranks(tmp_path, capsys, monkeypatch):
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--strategy", "nope", "--nproc", "2"),
                          "unknown strategy 'nope'", "allreduce, asp, ddp, diloco, ds-sync, gossip, hierarchical, local-sgd, psp, specsync, ssp, sync-switch, torch-hier")
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--strategy", "ds-sync", "--task", "imagenet", "--nproc", "2"),
                          "unknown task 'imagenet'")
    topo = tmp_path / "topology.json"
    Topology.from_rack_sizes([2, 2]).save(topo)
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--strategy", "ds-sync", "--topology", topo, "--nproc", "8"),
                          "topology has 4 workers but the job has 8 ranks")
    bad = tmp_path / "schedule.json"
    bad.write_text(json.dumps({"version": 1, "world_size": 4, "period": [[[0, 1], [2, 3]]]}))
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--strategy", "ds-sync", "--schedule", bad, "--nproc", "4"),
                          "does not mix")
    bad.write_text(json.dumps({"version": 1, "world_size": 4, "period": [[[0, 1, 2], [2, 3]]]}))
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--strategy", "ds-sync", "--schedule", bad, "--nproc", "4"),
                          "ranks in two groups [2]")
    good = tmp_path / "good.json"
    Schedule(world_size=4, period=(((0, 1, 2, 3),),)).save(good)
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--strategy", "ds-sync", "--schedule", good, "--nproc", "2"),
                          "schedule is for 4 ranks but the job has 2")
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--strategy", "ds-sync", "--backend", "horovod", "--nproc", "2"),
                          "--backend horovod")


def test_train_writes_the_json_contract(tmp_path):
    out = tmp_path / "run.json"
    proc = dssync("train", "--strategy", "ds-sync", "--task", "digits", "--nproc", "4",
                  "--steps", "120", "--json", out)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    for key in ("strategy", "task", "world_size", "steps", "final_accuracy", "best_accuracy",
                "wall_s", "comm_ms_per_iter", "schedule_changes"):
        assert key in record
    assert record["world_size"] == 4 and record["steps"] == 120
    assert record["final_accuracy"] > 0.85  # chance is 0.10
    assert record["best_accuracy"] >= record["final_accuracy"]
    assert len(record["comm_ms_samples"]) == 120 and record["comm_ms_per_iter"] > 0
    change = record["schedule_changes"][0]
    assert change["step"] == 0 and Schedule.from_dict(change["schedule"]).world_size == 4


@pytest.mark.parametrize(("args", "needle"), [
    (["--slow-nic", "fast"], "--slow-nic wants RANK:RATE"),
    (["--seconds", "0"], "--seconds: '0' must be 1 or more"),
])
def test_probe_backends_rejects_bad_input_before_building_anything(args, needle, capsys, monkeypatch):
    proc = in_process(capsys, monkeypatch, "bench", "probe-backends", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--strategy", "allreduce", "--overlap"], "--overlap applies to --strategy ds-sync only"),
    (["--strategy", "allreduce", "--adjust-every", "20"], "--adjust-every applies to --strategy ds-sync only"),
    (["--strategy", "ds-sync", "--adjust-every", "-1"], "--adjust-every: '-1' must be 1 or more"),
    (["--strategy", "ds-sync", "--max-pace", "0"], "--max-pace: '0' must be 1 or more"),
    (["--strategy", "allreduce", "--max-pace", "2"], "--max-pace applies to --strategy ds-sync only"),
    (["--strategy", "ds-sync", "--overlap", "--adjust-every", "20"], "overlap and adjust_every do not combine"),
    (["--strategy", "ds-sync", "--bucket-mb", "1"], "--bucket-mb applies to --overlap only"),
    (["--strategy", "ds-sync", "--overlap", "--bucket-mb", "-1"], "--bucket-mb: '-1' must be 0 or more"),
    (["--strategy", "psp", "--set", "quorum=3"], "psp has the settings delay_prob, delay_s, pull_fraction"),
    (["--strategy", "psp", "--set", "push_quorum=three"], "push_quorum must be of type int"),
    (["--strategy", "psp", "--set", "pull_fraction=1.5"], "pull_fraction must be in (0, 1]"),
    (["--strategy", "ssp", "--set", "staleness"], "write KEY=VALUE"),
    (["--strategy", "ssp", "--set", "staleness=-1"], "staleness must be 0 or more"),
    (["--strategy", "sync-switch", "--set", "switch_at=2"], "switch_at is a fraction of the workload in [0, 1]"),
])
def test_train_rejects_bad_strategy_settings(args, needle, capsys, monkeypatch):
    proc = in_process(capsys, monkeypatch, "train", "--nproc", "2", "--steps", "1", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr, proc.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--reps", "0"], "--reps: '0' must be 1 or more"),
    (["--bucket-mb", "-2"], "--bucket-mb: '-2' must be 0 or more"),
    (["--flows", "uplink:0"], "flow"),
])
def test_bench_overlap_rejects_bad_input_before_building_anything(args, needle, capsys, monkeypatch):
    proc = in_process(capsys, monkeypatch, "bench", "overlap", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr


def test_bench_allreduce_reports_nccl_tests_columns_and_no_wrong_elements(tmp_path):
    out = tmp_path / "ar.json"
    proc = dssync("bench", "allreduce", "--nproc", "4", "--rack-sizes", "3,1", "--groups", "racks",
                  "--sizes", "4K:64K", "--iters", "3", "--warmup", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "#wrong" in proc.stdout and "busbw" in proc.stdout and "Avg bus bandwidth" in proc.stdout
    record = json.loads(out.read_text())
    assert [r["size"] for r in record["rows"]] == [4096, 16384, 65536]
    for row in record["rows"]:
        assert row["wrong"] == 0 and row["group_size"] == 3 and row["count"] == row["size"] // 4
        assert row["algbw_gbs"] == pytest.approx(row["size"] / (row["time_us"] * 1e-6) / 1e9)
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 2 * 2 / 3)


@pytest.mark.parametrize(("args", "needle"), [
    (["--sizes", "lots"], "a size looks like 1024, 1K, 256M or 1G"),
    (["--sizes", "1M:1K"], "sizes must run from at least 4 bytes upward"),
    (["--factor", "1"], "the size factor must be at least 2"),
    (["--groups", "everyone"], "--groups is world, racks or a schedule.json file"),
    (["--groups", "racks", "--rack-sizes", "2,2"], "the topology has 4 workers but the job has 8 ranks"),
])
def test_bench_allreduce_rejects_bad_input_before_starting_ranks(args, needle, capsys, monkeypatch):
    proc = in_process(capsys, monkeypatch, "bench", "allreduce", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--scenario", "busy"], "unknown scenario 'busy'"),
    (["--strategies", "allreduce,nope"], "unknown strategy 'nope'"),
    (["--strategies", "psp:pull_fraction=0"], "pull_fraction must be in (0, 1]"),
    (["--strategies", "psp:c=3"], "psp has the settings"),
    (["--cpu", "4"], "write RANK:CORES"),
    (["--repeats", "0"], "--repeats: '0' must be 1 or more"),
])
def test_bench_compare_rejects_bad_input_before_building_anything(args, needle, capsys, monkeypatch):
    proc = in_process(capsys, monkeypatch, "bench", "compare", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr


def test_simulate_writes_every_strategy_and_ds_sync_beats_allreduce_under_contention(tmp_path):
    out = tmp_path / "sim.json"
    proc = dssync("simulate", "--racks", "4", "--workers-per-rack", "4", "--scenario", "inter-rack",
                  "--iterations", "50", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert set(record["strategies"]) == {"ddp", "allreduce", "hierarchical", "torch-hier", "diloco", "local-sgd", "gossip", "asp",
                                         "sync-switch", "ds-sync"}
    ms = {s: r["median_ms"] for s, r in record["strategies"].items()}
    assert ms["ds-sync"] < ms["allreduce"]


def test_the_commands_that_need_no_torch_run_without_importing_it(tmp_path):
    # The simulator and the planner are data in, data out: their commands start in a fraction
    # of the second torch's import takes. The oracle is the interpreter's own module table.
    code = (
        "import sys\n"
        "from dssync.cli import main\n"
        f"assert main(['simulate', '--racks', '2', '--workers-per-rack', '4', '--iterations', '5', "
        f"'--contended-uplinks', '0.5', '--strategies', 'ds-sync:world_first=0.25,gossip']) == 0\n"
        f"assert main(['plan', '--rack-sizes', '3,5', '--slow-uplinks', '1', '--out', {str(tmp_path / 's.json')!r}]) == 0\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'dssync.strategies'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert Schedule.load(tmp_path / "s.json").world_size == 8


def test_bench_predict_carries_the_measured_iterations_to_target_to_every_scale(tmp_path):
    """On the recorded simcheck and compare records: ddp is its own reference (1.0), a
    strategy that never reached the target has no prediction, and every other ratio is ddp's
    wall time over the strategy's, weighted by the iterations each took in the compare record."""
    from dssync.bench.predict import iterations_factors

    out, png = tmp_path / "p.json", tmp_path / "p.png"
    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    proc = dssync("bench", "predict", "--simcheck", results / "simcheck.json", "--compare", results / "compare.json",
                  "--racks", "2,4", "--workers-per-rack", "4", "--contended", "0,0.5",
                  "--iterations", "40", "--json", str(out), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    rows = record["rows"]
    assert {(r["workers"], r["contended_fraction"]) for r in rows} == {(8, 0.0), (16, 0.0), (8, 0.5), (16, 0.5)}
    compare = json.loads((results / "compare.json").read_text())
    factors = iterations_factors(compare)
    for r in rows:
        if r["strategy"] == "ddp":
            assert r["tta_ratio"] == pytest.approx(1.0)
        elif factors[r["strategy"]]["factor"] is None:
            assert r["tta_ratio"] is None
        else:
            ddp = next(d for d in rows if d["strategy"] == "ddp" and d["workers"] == r["workers"]
                       and d["contended_fraction"] == r["contended_fraction"])
            assert r["tta_ratio"] == pytest.approx(ddp["wall_ms"] / r["wall_ms"] / factors[r["strategy"]]["factor"])
    assert png.stat().st_size > 10_000


def test_bench_simcheck_replays_a_record_on_the_flow_model(tmp_path, capsys, monkeypatch):
    """--model flows prices every job of the record with the event-driven model, at the
    measured queue and round trip, and says so in the record; a queue measured at another
    rate scale is refused."""
    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    out = tmp_path / "flows.json"
    proc = in_process(capsys, monkeypatch, "bench", "simcheck", "--from", str(results / "simcheck-slow-links.json"),
                      "--model", "flows", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    record, source = json.loads(out.read_text()), json.loads((results / "simcheck-slow-links.json").read_text())
    queue = json.loads((results / "queue-rtt.json").read_text())
    assert record["flow_model"]["queue_s"] == queue["queue_s"] and record["flow_model"]["rtt_s"] == queue["rtt_s"]
    # the jobs keep the code that measured them; the replay names the model's code apart
    assert record["provenance"] == json.loads((results / "simcheck-slow-links.json").read_text())["provenance"]
    assert record["replayed"]["model"] == "flows" and record["replayed"]["from"].endswith("simcheck-slow-links.json")
    assert {"commit", "date", "cores"} <= set(record["replayed"]["provenance"])
    jobs = {(j["scenario"], j["strategy"], j["seed"]): j for j in source["jobs"]}
    assert len(record["rows"]) == len(jobs)
    for r in record["rows"]:
        job = jobs[(r["scenario"], r["strategy"], r["seed"])]
        assert r["wall_ms"] == job["wall_ms"]
        assert r["wall_ratio"] == pytest.approx(r["sim_wall_ms"] / job["wall_ms"])
    iterations = {(r["scenario"], r["strategy"]): r["sim_wall_ms"] for r in source["rows"]}
    assert any(r["sim_wall_ms"] != pytest.approx(iterations[(r["scenario"], r["strategy"])], rel=1e-3)
               for r in record["rows"])  # another model than the record's own
    other = tmp_path / "queue.json"
    other.write_text(json.dumps({**queue, "rate_scale": 0.1}))
    proc = in_process(capsys, monkeypatch, "bench", "simcheck", "--from", str(results / "simcheck-slow-links.json"),
                      "--model", "flows", "--queue-rtt", str(other))
    assert proc.returncode == 2 and "measured at rate scale 0.1" in proc.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--racks", "4"], "--racks needs a positive --workers-per-rack"),
    (["--rack-sizes", "2,2", "--scenario", "inter-rack+nic"], "names rank 4; the layout [2, 2] has no such rank"),
    (["--rack-sizes", "2,2", "--strategies", "allreduce,nope"], "unknown strategy 'nope'"),
    (["--rack-sizes", "2,2", "--iterations", "0"], "--iterations: '0' must be 1 or more"),
])
def test_simulate_rejects_bad_input(args, needle, capsys, monkeypatch):
    proc = in_process(capsys, monkeypatch, "simulate", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr


def test_plan_paces_the_racks_on_request(tmp_path, capsys, monkeypatch):
    topo = tmp_path / "topology.json"
    Topology.from_rack_sizes([4, 4]).save(topo)
    out = tmp_path / "schedule.json"
    proc = in_process(capsys, monkeypatch, "plan", topo, "--out", out, "--pace", "4")
    assert proc.returncode == 0, proc.stderr
    assert "static, paced by 4" in proc.stdout and "period 16" in proc.stdout
    crossing = [t for t, p in enumerate(Schedule.load(out).period) if any(len({r // 4 for r in g}) > 1 for g in p)]
    assert crossing == [0, 4, 8, 12]
    bad = in_process(capsys, monkeypatch, "plan", topo, "--out", out, "--pace", "0")
    assert_one_line_error(bad, "--pace: '0' must be 1 or more")


def test_tune_sync_switch_writes_a_policy_that_a_recurring_job_reuses(tmp_path):
    policy = tmp_path / "policy.json"
    proc = dssync("tune", "sync-switch", "--steps", "20", "--nproc", "2", "--settings", "1", "--out", policy)
    assert proc.returncode == 0, proc.stderr
    first = json.loads(policy.read_text())
    assert [t["switch_at"] for t in first["trials"]] == [1.0, 0.5]  # pure BSP for the target, then the middle
    assert first["target_accuracy"] == first["trials"][0]["accuracy"] > 0.1
    assert first["switch_at"] in (0.5, 1.0) and "--set switch_at=" in proc.stdout
    again = tmp_path / "again.json"
    proc = dssync("tune", "sync-switch", "--steps", "20", "--nproc", "2", "--settings", "1", "--reuse", policy,
                  "--out", again)
    assert proc.returncode == 0, proc.stderr
    reused = json.loads(again.read_text())
    assert [t["switch_at"] for t in reused["trials"]] == [0.5]  # no BSP trial: the target is known
    assert reused["target_accuracy"] == first["target_accuracy"]
    proc = dssync("tune", "sync-switch", "--steps", "30", "--nproc", "2", "--reuse", policy)
    assert proc.returncode == 2 and "tuned for another job: {'steps': (20, 30)}" in proc.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--lr", "nan"], "--lr: 'nan' is not a finite number"),
    (["--lr", "inf"], "--lr: 'inf' is not a finite number"),
    (["--lr", "-1"], "--lr: '-1' must be above zero"),
    (["--racks", "0"], "--racks: '0' must be 1 or more"),
    (["--timeout", "0"], "--timeout: '0' must be above zero"),
    (["--timeout", "-1"], "--timeout: '-1' must be above zero"),
    (["--timeout", "nan"], "--timeout: 'nan' is not a finite number"),
    (["--steps", "x"], "--steps: 'x' is not an integer"),
    (["--nproc", "0"], "--nproc: '0' must be 1 or more"),
    (["--nproc", "2", "--pace", "1"], "unrecognized arguments: --pace 1"),
    (["--model-mb", "1e400"], "--model-mb: '1e400' is not a finite number"),
    (["--strategy", "psp", "--set", "delay_s=nan"], "delay_s must be of type float (a finite number)"),
    (["--json", "{tmp}/missing/run.json"], "the folder {tmp}/missing does not exist"),
    (["--json", "{tmp}"], "it exists and is not a regular file"),
    (["--checkpoint", "{tmp}/ck", "--strategy", "asp"], "asp cannot be checkpointed yet"),
    (["--stop-after", "2"], "need a checkpoint folder"),
    (["--stop-after", "5", "--checkpoint", "{tmp}/ck"], "stop_after must be in 1..steps (3), got 5"),
    (["--device", "cuda"], "GPUs visible here"),
    (["--device", "cuda", "--strategy", "ssp"], "ssp keeps its model on the CPU"),
    (["--nproc", "100000"], "--nproc 100000: 100000 local ranks need about"),
])
def test_train_refuses_bad_flags_on_one_line_before_anything_runs(tmp_path, args, needle, capsys, monkeypatch):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--strategy" not in args:
        args = ["--strategy", "ds-sync", *args]
    before = sorted(tmp_path.rglob("*"))
    if "--nproc" not in args:
        args = ["--nproc", "2", *args]
    proc = in_process(capsys, monkeypatch, "train", "--steps", "3", *args)
    assert proc.returncode == 2
    assert_one_line_error(proc, needle.replace("{tmp}", str(tmp_path)))
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize(("args", "needle"), [
    (["--pace", "100000000"], "pace must be 1 (every round) to 64, got 100000000"),
    (["--pace", "0"], "--pace: '0' must be 1 or more"),
    (["--max-period", "-3"], "--max-period: '-3' must be 1 or more"),
    (["--message-mb", "nan"], "--message-mb: 'nan' is not a finite number"),
])
def test_plan_refuses_bad_flags_on_one_line(tmp_path, args, needle, capsys, monkeypatch):
    out = tmp_path / "schedule.json"
    assert_one_line_error(in_process(capsys, monkeypatch, "plan", "--rack-sizes", "4,4", "--out", out, *args), needle)
    assert not out.exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["--racks-from", "hostnames:^no-such-host-(\\d)"], "rank 0's host"),
    (["--racks-from", "hostnames:rack("], "--racks-from: hostnames:rack(: 'rack(' is no regular expression"),
    (["--racks-from", "racks.txt"], "argument --racks-from: takes slurm or hostnames:REGEX, got 'racks.txt'"),
    (["--racks-from", "hostnames:.", "--rack-sizes", "1,1"], "give --rack-sizes (racks taken as they are) or "
                                                             "--racks-from"),
])
def test_probe_refuses_racks_from_it_cannot_use_on_one_line_before_any_rank_starts(tmp_path, args, needle, capsys,
                                                                                   monkeypatch):
    out = tmp_path / "topology.json"
    assert_one_line_error(in_process(capsys, monkeypatch, "probe", "--out", out, *args), needle)
    assert not out.exists()


@pytest.mark.parametrize("args", [["train", "--nproc", "2", "--steps", "3", "--lr", "nan"],
                                  ["plan", "--rack-sizes", "4,4", "--pace", "0"]])
def test_a_refusal_at_the_shell_is_one_line(tmp_path, args):
    proc = dssync(*args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert_one_line_error(proc, "is not a finite number" if "--lr" in args else "must be 1 or more")
    assert list(tmp_path.iterdir()) == []


def test_probe_racks_from_slurm_without_slurm_says_so(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no scontrol there
    proc = subprocess.run([sys.executable, "-m", "dssync.cli", "probe", "--out", str(tmp_path / "t.json"),
                           "--racks-from", "slurm"], capture_output=True, text=True, env=env, timeout=600)
    assert_one_line_error(proc, "--racks-from: slurm needs scontrol, SLURM's client, on the PATH")


def test_train_takes_racks_from_only_where_ds_sync_probes(tmp_path):
    for args in (["--strategy", "ddp"], ["--strategy", "ds-sync", "--rack-sizes", "1,1"]):
        proc = dssync("train", "--nproc", "2", "--steps", "3", *args, "--racks-from", "hostnames:.")
        assert_one_line_error(proc, "--racks-from applies when ds-sync probes the network")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_while_the_interpreter_exits_ends_it_without_a_traceback(sig):
    """`timeout -k`, or a second Ctrl-C, may land after dssync has caught the first signal
    and returned, while the interpreter runs its exit handlers (torch registers some): the
    process ends by that signal, and stderr keeps the one line about the first."""
    child = subprocess.run([sys.executable, "-c", (
        "import atexit, os, signal, sys, time\n"
        "from dssync import cli\n"
        "from dssync.commands import plan\n"
        "def second():\n"
        f"    os.kill(os.getpid(), {int(sig)})\n"
        "    time.sleep(2)\n"
        "    print('survived the second signal', file=sys.stderr)\n"
        "atexit.register(second)\n"
        f"plan.run = lambda args: os.kill(os.getpid(), {int(sig)}) or time.sleep(5)\n"
        "sys.exit(cli.main(['plan', '--rack-sizes', '2,2', '--out', os.devnull]))\n")],
        capture_output=True, text=True, timeout=60,
        # as at a terminal: a suite started in the background of a shell inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    word = "terminated" if sig == signal.SIGTERM else "interrupted"
    assert child.stderr.splitlines() == [f"dssync plan: {word}"], child.stderr
    assert child.returncode == -sig, (child.returncode, child.stderr)


def test_train_from_a_job_config_runs_the_job_the_flags_describe(tmp_path):
    """``--config`` carries every setting as the config's JSON: the run's record holds the same
    settings, and trains the same model, as the run the flags describe."""
    from dssync.training.loop import TrainConfig

    flags = ["--strategy", "psp", "--set", "push_quorum=2", "--steps", "30", "--seed", "3", "--lr", "0.2",
             "--weight-decay", "0.01", "--eval-every", "15", "--rack-sizes", "1,1"]
    job = tmp_path / "job.json"
    job.write_text(json.dumps(TrainConfig(
        strategy="psp", strategy_options={"push_quorum": 2}, steps=30, seed=3, lr=0.2, weight_decay=0.01,
        eval_every=15, topology=Topology.from_rack_sizes([1, 1]), probe_first=True).to_dict()))
    by_flags = dssync("train", *flags, "--no-progress", "--json", tmp_path / "a.json")
    by_config = dssync("train", "--config", job, "--no-progress", "--json", tmp_path / "b.json")
    assert by_flags.returncode == 0 and by_config.returncode == 0, by_flags.stderr + by_config.stderr
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["config"] == b["config"] and b["config"]["strategy_options"] == {"push_quorum": 2}
    assert a["world_size"] == b["world_size"] == 2
    assert b["final_accuracy"] > 0.5  # it trained (chance is 0.10)


def test_train_config_refuses_settings_beside_it_and_bad_files(tmp_path, capsys, monkeypatch):
    from dssync.training.loop import TrainConfig

    job = tmp_path / "job.json"
    job.write_text(json.dumps(TrainConfig(strategy="ddp").to_dict()))
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--config", job, "--lr", "0.3", "--seed", "2"),
                          "holds every setting of the run; --lr, --seed cannot go with it")
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--config", tmp_path / "none.json"),
                          "none.json: No such file")
    job.write_text("{not json")
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--config", job), "not JSON")
    job.write_text(json.dumps(dict(TrainConfig(strategy="ddp").to_dict(), steps="many")))
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--config", job), "steps must be")
    assert_one_line_error(in_process(capsys, monkeypatch, "train", "--nproc", "2"), "give --strategy NAME")
