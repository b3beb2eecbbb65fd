"""Every bench record says where it came from: commit, command, date, cores."""

import argparse
import datetime
import json
import os
import subprocess
from pathlib import Path

from dssync.bench.provenance import provenance
from dssync.commands.bench._shared import report_records

REPO = Path(__file__).resolve().parents[2]


def test_provenance_names_this_checkouts_commit_the_command_and_the_cores():
    prov = provenance(["bench", "compare", "--scenario", "static,inter-rack", "--strategies", "ddp,local-sgd:period=4"])
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # run from a checkout (as CI is)
        assert prov["commit"] == head.stdout.strip()
    assert prov["command"] == "dssync bench compare --scenario static,inter-rack --strategies ddp,local-sgd:period=4"
    assert prov["cores"] == len(os.sched_getaffinity(0))
    with open("/proc/cpuinfo") as f:  # the processor, whose speed the emulated timings depend on
        models = {line.split(":", 1)[1].strip() for line in f if line.split(":", 1)[0].strip() == "model name"}
    assert prov["cpu"] in models
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:  # what the emulated hosts' TCP runs
        assert prov["tcp_congestion_control"] == f.read().strip()
    when = datetime.datetime.fromisoformat(prov["date"])
    assert abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) < 60


def test_a_bench_report_stamps_every_record_and_the_markdowns_first_line(tmp_path, capsys):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    report_records("| a |\n|---|\n| 1 |", [{"strategy": "ddp"}, {"strategy": "ds-sync"}],
            argparse.Namespace(json=str(out), markdown=str(md)))
    records = json.loads(out.read_text())
    assert [r["strategy"] for r in records] == ["ddp", "ds-sync"]
    assert all(set(r["provenance"]) >= {"commit", "command", "date", "cores"} for r in records)
    first, blank, *rest = md.read_text().splitlines()
    assert first.startswith("Measured at commit ") and records[0]["provenance"]["command"] in first
    assert blank == "" and rest == ["| a |", "|---|", "| 1 |"]
    assert capsys.readouterr().out == "| a |\n|---|\n| 1 |\n"
    one = tmp_path / "one.json"
    report_records("t", {"rows": [1]}, argparse.Namespace(json=str(one), markdown=None))
    assert json.loads(one.read_text())["provenance"]["cores"] >= 1


def test_a_bench_is_credited_to_the_code_it_started_with(tmp_path, monkeypatch):
    import dssync.bench.provenance as provenance_module
    from dssync.commands.bench._shared import outputs_checked

    base = {"command": "dssync bench x", "date": "2026-01-01T00:00:00+00:00", "cores": 2, "dirty": False}
    taken = iter([dict(base, commit="a" * 40), dict(base, commit="b" * 40)])  # a commit lands mid-bench
    monkeypatch.setattr(provenance_module, "provenance", lambda argv=None: next(taken))
    out = tmp_path / "r.json"

    def bench(args):
        report_records("t", [{"strategy": "ddp"}], args)
        return 0

    assert outputs_checked(bench)(argparse.Namespace(json=str(out), markdown=None)) == 0
    assert json.loads(out.read_text())[0]["provenance"]["commit"] == "a" * 40


def test_a_resumed_measurement_says_which_runs_older_code_measured(tmp_path):
    md = tmp_path / "r.md"
    now = {"commit": "c" * 40, "command": "dssync bench compare --resume", "date": "2026-01-02T00:00:00+00:00",
           "cores": 2}
    records = [{"strategy": "ddp", "provenance": {"commit": "a" * 40}}, {"strategy": "ddp"}, {"strategy": "gossip"}]
    report_records("t", records, argparse.Namespace(json=None, markdown=str(md), provenance=now))
    first = md.read_text().splitlines()[0]
    assert first.startswith("Measured at commit cccccccccccc") and "(runs by commit: aaaaaaaaaaaa 1, cccccccccccc 2)" in first


def test_records_being_written_do_not_make_the_code_dirty(tmp_path, monkeypatch):
    import dssync.bench.provenance as provenance_module

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "r.json").write_text("[]")
    (tmp_path / "bench" / "loop.py").write_text("x = 1\n")
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "records and code")
    monkeypatch.setattr(provenance_module, "_HERE", tmp_path / "bench")
    assert provenance_module.provenance([])["dirty"] is False
    (tmp_path / "bench" / "results" / "r.json").write_text("[1]")  # a bench rewriting its record
    assert provenance_module.provenance([])["dirty"] is False
    (tmp_path / "bench" / "loop.py").write_text("x = 2\n")  # the measured code changed
    assert provenance_module.provenance([])["dirty"] is True


def test_a_module_bench_writes_its_record_with_the_command_that_ran_it(tmp_path):
    from dssync.bench.provenance import write_module_record

    out = tmp_path / "r.json"
    write_module_record(out, {"rows": [1, 2]}, "dssync.bench.retrans", ["--scenario", "inter-rack"])
    record = json.loads(out.read_text())
    assert record["rows"] == [1, 2]
    assert record["provenance"]["command"] == "dssync python -m dssync.bench.retrans --scenario inter-rack"
    assert {"commit", "date", "cores"} <= set(record["provenance"])
