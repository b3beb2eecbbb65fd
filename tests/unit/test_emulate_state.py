"""The emulated cluster's state file is read back by `emulate contend`, `run` and `down`: a
field that becomes a namespace or cgroup path, or a process to kill, is checked first."""

import json
import subprocess
import time
from pathlib import Path

import pytest

from dssync.launch.emulate import EmulationError, load_state
from dssync.launch.emulate.contention import _kill_flow

GOOD = {"name": "abc", "rack_sizes": [2, 2], "nic_bps": 10**9, "uplink_bps": 10**9, "nic_override": {},
        "uplink_override": {}, "flows": [], "cpu_limit": {}}


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DSSYNC_STATE_DIR", str(tmp_path))
    return tmp_path


def test_a_well_formed_state_loads(state_dir):
    (state_dir / "abc.json").write_text(json.dumps(GOOD))
    assert load_state("abc").rack_sizes == [2, 2]


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("name", "../../sys/fs/cgroup/x", "names the cluster '../../sys/fs/cgroup/x'"),
    ("name", "other", "names the cluster 'other'"),
    ("flows", [{"kind": "rack", "index": 0, "pids": [1]}], "flow rack:0 has pids [1]"),
    ("flows", [{"kind": "nic", "index": 2, "pids": [True]}], "flow nic:2 has pids [True]"),
    ("nic_override", {"x": 5}, "invalid literal"),
    ("surprise", 1, "unexpected keyword"),
])
def test_a_damaged_state_file_is_one_line_naming_it(state_dir, field, value, needle):
    (state_dir / "abc.json").write_text(json.dumps({**GOOD, field: value}))
    with pytest.raises(EmulationError) as err:
        load_state("abc")
    message = str(err.value)
    assert len(message.splitlines()) == 1 and str(state_dir / "abc.json") in message and needle in message


def test_ending_a_flow_ends_only_an_iperf3_that_leads_its_group():
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        _kill_flow({"kind": "rack", "index": 0, "pids": [bystander.pid]})
        with pytest.raises(subprocess.TimeoutExpired):  # a SIGKILL would end it at once
            bystander.wait(timeout=0.5)
    finally:
        bystander.kill()
        bystander.wait()


def test_ending_a_flow_ends_its_iperf3():
    from dssync.launch.spawn import free_port

    server = subprocess.Popen(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(free_port())],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{server.pid}/cmdline").read_bytes().startswith(b"iperf3"):  # exec'd
            assert time.monotonic() < deadline, "iperf3 did not start within 10 s"
            time.sleep(0.01)
        _kill_flow({"kind": "rack", "index": 0, "pids": [server.pid]})
        assert server.wait(timeout=5) == -9
    finally:
        server.kill()
        server.wait()


def test_a_busy_loop_is_a_flow_of_its_own_kind():
    from dssync.launch.emulate import Cluster, parse_flow
    from dssync.launch.emulate.contention import BUSY_LOOP_MARK, busy_loop_argv

    assert parse_flow("cpu:3") == ("cpu", 3)
    argv = busy_loop_argv(Cluster(**GOOD), 1)
    assert argv[:4] == ["ip", "netns", "exec", "abc-w1"] and BUSY_LOOP_MARK in argv[-1]


def _leader(code: str) -> subprocess.Popen:
    """A python process leading its own group (sleeping, so that a test costs no CPU)."""
    import sys

    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 10
    while b"-c" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc


def test_ending_a_busy_loop_ends_only_a_process_that_carries_its_mark():
    from dssync.launch.emulate.contention import BUSY_LOOP_MARK

    marked = _leader(f"import time; time.sleep(30)  # {BUSY_LOOP_MARK} abc 1")
    bystander = _leader("import time; time.sleep(30)")
    try:
        _kill_flow({"kind": "cpu", "index": 1, "pids": [bystander.pid]})
        _kill_flow({"kind": "rack", "index": 0, "pids": [marked.pid]})  # not an iperf3
        for proc in (bystander, marked):
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.3)
        _kill_flow({"kind": "cpu", "index": 1, "pids": [marked.pid]})
        assert marked.wait(timeout=5) == -9
    finally:
        for proc in (marked, bystander):
            proc.kill()
            proc.wait()
