"""Real emulated networks: namespaces, bridges, veths and tbf, measured with iperf3."""

import io
import json
import re
import subprocess
import time

import pytest

from dssync.launch import emulate

pytestmark = pytest.mark.emulate


def iperf_mbps(c, src: int, dst: int, seconds: float = 2.0) -> float:
    server = subprocess.Popen(["ip", "netns", "exec", c.worker_ns(dst), "iperf3", "-s", "-1", "-p", "5399"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            proc = subprocess.run(["ip", "netns", "exec", c.worker_ns(src), "iperf3", "-c",
                                   c.worker_addr(dst), "-p", "5399", "-t", str(seconds), "-J"],
                                  capture_output=True, text=True, timeout=60)
            result = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
            if proc.returncode == 0 and "sum_received" in result.get("end", {}):
                return result["end"]["sum_received"]["bits_per_second"] / 1e6
            subprocess.run(["sleep", "0.1"])
        raise AssertionError(f"iperf3 {src}->{dst} never completed: {proc.stdout[-500:]}")
    finally:
        server.kill()
        server.wait()


def test_run_sets_the_launcher_environment_and_returns_the_worst_exit_code(name):
    with emulate.cluster([2, 1], nic="200mbit", uplink="200mbit", name=name) as c:
        out = io.StringIO()
        code = emulate.run(["sh", "-c", 'echo "$RANK $WORLD_SIZE $MASTER_ADDR $GLOO_SOCKET_IFNAME '
                            '$(ip -o -4 addr show eth0 | cut -d" " -f7)"; exit $RANK'], name=name, out=out)
        assert code == 2  # ranks exit 0, 1, 2
        lines = sorted(out.getvalue().splitlines())
        assert lines == [f"[w{r}] {r} 3 10.77.0.1 eth0 {c.worker_addr(r)}/16" for r in range(3)]


def test_nics_and_uplinks_are_shaped_and_contention_is_real(name):
    with emulate.cluster([2, 2], nic="200mbit", uplink="200mbit", name=name) as c:
        intra, cross = iperf_mbps(c, 0, 1), iperf_mbps(c, 0, 2)
        assert 150 < intra < 215 and 150 < cross < 215  # tbf at 200 Mbit/s
        emulate.contend(name=name, rack=0, uplink="50mbit")
        assert 35 < iperf_mbps(c, 0, 2) < 55  # across the lowered uplink
        assert 150 < iperf_mbps(c, 0, 1) < 215  # inside the rack: untouched
        emulate.contend(name=name, clear=True, flows=[("rank", 1)])
        shared = iperf_mbps(c, 1, 0)  # worker 1's NIC now carries a background flow
        assert shared < 0.6 * intra
        emulate.contend(name=name, clear=True)
        assert 150 < iperf_mbps(c, 1, 0) < 215


def test_every_host_has_the_clusters_tcp_settings(name):
    with emulate.cluster([1, 1], name=name) as c:
        hosts = [c.worker_ns(0), c.worker_ns(1), c.bg_ns(0), c.bg_ns(1), c.sink_ns]
        for ns in hosts:
            route = subprocess.run(["ip", "-n", ns, "route", "show", "dev", "eth0"], capture_output=True,
                                   text=True, check=True).stdout
            assert f"rto_min lock {emulate.RTO_MIN_MS}ms" in route, (ns, route)
            assert len(route.strip().splitlines()) == 1, (ns, route)  # replaced, not added beside
            idle = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.tcp_slow_start_after_idle"],
                                  capture_output=True, text=True, check=True).stdout
            assert idle.strip() == "0", ns


def test_up_twice_is_an_error_and_leaves_the_first_intact(name):
    with emulate.cluster([1, 1], name=name) as c:
        with pytest.raises(emulate.EmulationError, match="already up"):
            emulate.up([1, 1], name=name)
        assert sorted(emulate.leftovers(name)) == sorted(c.namespaces())


def test_a_failure_while_building_leaves_nothing(name, monkeypatch):
    calls = []
    real = emulate.build.attach_worker

    def flaky(*args):
        calls.append(args)
        if len(calls) == 3:
            raise emulate.EmulationError("injected failure")
        return real(*args)

    monkeypatch.setattr(emulate.build, "attach_worker", flaky)  # where up() looks it up
    with pytest.raises(emulate.EmulationError, match="injected"):
        emulate.up([2, 2], name=name)
    assert emulate.leftovers(name) == []


def test_a_test_that_fails_midway_leaves_nothing(name):
    with pytest.raises(RuntimeError, match="midway"), emulate.cluster([2, 2], name=name):
        emulate.contend(name=name, flows=[("rack", 0)])
        raise RuntimeError("the test failed midway")
    assert emulate.leftovers(name) == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"{name}-" not in ps  # no background flow outlives the cluster


@pytest.mark.parametrize(("text", "bps"), [("1gbit", 10**9), ("500mbit", 5 * 10**8), ("300M", 3 * 10**8),
                                            ("1.5G", 15 * 10**8), ("64kbit", 64000)])
def test_parse_rate(text, bps):
    assert emulate.parse_rate(text) == bps


@pytest.mark.parametrize("text", ["fast", "1 gigabit", "-3M", "1kbit"])
def test_bad_rates(text):
    with pytest.raises(ValueError, match="rate"):
        emulate.parse_rate(text)


def test_training_runs_across_the_emulated_racks(name, tmp_path, exec_workers):
    import sys
    from pathlib import Path

    out = tmp_path / "run.json"
    dssync = str(Path(sys.executable).with_name("dssync"))
    with emulate.cluster([2, 2], nic="500mbit", uplink="500mbit", name=name):
        log = io.StringIO()
        code = emulate.run([dssync, "train", "--strategy", "ds-sync", "--steps", "40",
                            "--no-progress", "--timeout", "60", "--json", str(out)],
                           name=name, timeout_s=240, out=log)
        assert code == 0, log.getvalue()[-2000:]
    record = json.loads(out.read_text())
    assert record["world_size"] == 4 and len(record["comm_ms_samples"]) == 40
    assert log.getvalue().count('"strategy"') == 1  # rank 0 alone reports


@pytest.mark.parametrize(("text", "flow"), [("rack:0", ("rack", 0)), ("rank:4", ("rank", 4)), ("nic:5", ("nic", 5))])
def test_parse_flow(text, flow):
    assert emulate.parse_flow(text) == flow


@pytest.mark.parametrize("text", ["nic", "switch:1", "rack:-1", "rank:x"])
def test_bad_flows(text):
    with pytest.raises(ValueError, match="cannot read flow"):
        emulate.parse_flow(text)


def test_sigterm_brings_the_cluster_down(name):
    """`timeout` and batch schedulers stop a benchmark with SIGTERM; the cluster must go too."""
    import sys

    child = subprocess.Popen([sys.executable, "-c", (
        "import time\n"
        "from dssync.cli import raise_on_sigterm, Terminated\n"
        "from dssync.launch import emulate\n"
        "raise_on_sigterm()\n"
        "try:\n"
        f"    with emulate.cluster([2, 1], name={name!r}):\n"
        f"        emulate.contend(name={name!r}, flows=[('rack', 0)])\n"
        "        print('up', flush=True)\n"
        "        time.sleep(120)\n"
        "except Terminated:\n"
        "    raise SystemExit(143)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        assert emulate.leftovers(name)  # the cluster is there while the child runs
        child.terminate()
        assert child.wait(timeout=60) == 143
    finally:
        child.kill()
    assert emulate.leftovers(name) == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"{name}-" not in ps


def test_a_cpu_limit_puts_the_workers_processes_in_a_capped_cgroup_and_down_removes_it(name):
    with emulate.cluster([2], nic="200mbit", uplink="200mbit", name=name) as c:
        emulate.contend(name=name, cpu={1: 0.2})
        group = emulate.cpu_cgroup(name, 1)
        quota = (group / "cpu.max").read_text().split()[0] if (group / "cpu.max").exists() else \
            (group / "cpu.cfs_quota_us").read_text().strip()
        assert quota == "20000"  # 0.2 of a 100 ms period
        out = io.StringIO()
        assert emulate.run(["cat", "/proc/self/cgroup"], name=name, out=out) == 0
        lines = out.getvalue().splitlines()
        assert any(f"dssync-{name}-w1" in line for line in lines if line.startswith("[w1]")), lines
        assert not any(f"dssync-{name}-" in line for line in lines if line.startswith("[w0]")), lines
        assert emulate.load_state(name).cpu_limit == {1: 0.2}
        with pytest.raises(ValueError, match="ranks are 0..1"):
            emulate.contend(name=name, cpu={5: 0.5})
        assert c.world_size == 2
    assert not group.exists()  # down took the cgroup with it


def test_cpu_limits_are_read_as_rank_and_cores():
    assert emulate.parse_cpu_limit("4:0.25") == (4, 0.25)
    assert emulate.parse_cpu_limit(" 0:1 ") == (0, 1.0)
    for bad in ("4", "x:0.5", "4:0", "4:-1"):
        with pytest.raises(ValueError, match="RANK:CORES"):
            emulate.parse_cpu_limit(bad)


def _run_in_background(**kwargs):
    """``emulate.run`` in a thread, so that the test can look at the cluster while it runs."""
    import threading

    result = {}
    runner = threading.Thread(target=lambda: result.update(code=emulate.run(**kwargs)), daemon=True)
    runner.start()
    return runner, result


def _cpu_quota(name: str, rank: int) -> str:
    group = emulate.cpu_cgroup(name, rank)
    return ((group / "cpu.max").read_text().split()[0] if (group / "cpu.max").exists()
            else (group / "cpu.cfs_quota_us").read_text().strip())


def _until(condition, what: str, seconds: float = 20.0):
    """Polls ``condition()`` until it is true; returns the wall time it was first seen so.
    The deadline fails the test saying what was awaited."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(0.02)
    return time.time()


def test_a_cpu_episode_caps_the_worker_during_it_and_not_after(name):
    import sys

    # Worker 1 burns CPU for 4 s and prints, per half second, the wall time the half second
    # began and the share of a core it got. The episode's start and end are taken from the
    # cgroup as it changes, so a slow start of the job on a busy machine shifts nothing.
    burn = ("import os, sys, time\n"
            "if os.environ['RANK'] != '1': sys.exit(0)\n"
            "t0 = time.time()\n"
            "while time.time() - t0 < 4.0:\n"
            "    wall, cpu = time.time(), time.process_time()\n"
            "    while time.time() - wall < 0.5: pass\n"
            "    print(f'{wall:.3f} {(time.process_time() - cpu) / (time.time() - wall):.3f}', flush=True)\n")
    with emulate.cluster([2], nic="200mbit", uplink="200mbit", name=name):
        out = io.StringIO()
        runner, result = _run_in_background(
            command=[sys.executable, "-c", burn], name=name, out=out, timeout_s=60,
            episodes=[emulate.parse_episode("1:cpu=0.1@0.5+2"),  # from 0.5 s to 2.5 s
                      emulate.parse_episode("0:cpu=0.3@0+60")])  # still on when the job ends
        # the worker's cgroup is made as the job starts
        capped_at = _until(lambda: emulate.cpu_cgroup(name, 1).exists() and _cpu_quota(name, 1) == "10000",
                           "worker 1's episode to cap it")
        other = _cpu_quota(name, 0)
        freed_at = _until(lambda: _cpu_quota(name, 1) in ("-1", "max"), "worker 1's episode to end")
        runner.join(timeout=60)
        assert result.get("code") == 0, out.getvalue()
        assert other == "30000"  # 0.1 and 0.3 of a 100 ms period
        assert 1.5 < freed_at - capped_at < 2.5, (capped_at, freed_at)
        assert _cpu_quota(name, 0) in ("-1", "max")  # undone when the job ended, long before its end
        lines = out.getvalue().splitlines()
        shares = [tuple(map(float, line.split()[1:])) for line in lines if line.startswith("[w1] ")]
        capped = [share for at, share in shares if capped_at < at and at + 0.5 < freed_at - 0.1]
        free = [share for at, share in shares if at > freed_at]
        assert capped and free, lines
        # The cap bit (0.1 of a core, half of that again for the period's granularity), and
        # only during the episode: after it the worker gets more than the cap allows, as much
        # as the machine's other work leaves it.
        assert max(capped) < 0.15 < max(free), shares
        assert re.search(r"^\[episode\] worker 1: cpu 0\.1 cores \(at \d+\.\d s, for 2 s\)$", out.getvalue(), re.M)
        assert re.search(r"^\[episode\] worker 1: cpu restored \(at \d+\.\d s\)$", out.getvalue(), re.M)
        assert re.search(r"^\[episode\] worker 0: cpu restored \(at \d+\.\d s\)$", out.getvalue(), re.M)
    assert not emulate.cpu_cgroup(name, 1).exists()  # down took the cgroups with it


def test_a_nic_episode_reshapes_the_workers_nic_both_ways_and_restores_it(name):
    def rates(c) -> list[str]:
        shown = [subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev],
                                capture_output=True, text=True, check=True).stdout
                 for ns, dev in ((c.worker_ns(1), "eth0"), (c.fabric, "w1"))]
        return [re.search(r"rate (\S+)", text).group(1) for text in shown]

    with emulate.cluster([2], nic="200mbit", uplink="200mbit", name=name) as c:
        out = io.StringIO()
        assert rates(c) == ["200Mbit", "200Mbit"]
        runner, result = _run_in_background(command=["sleep", "4"], name=name, out=out, timeout_s=60,
                                            episodes=[emulate.parse_episode("1:nic=50mbit@0.3+1.2")])
        _until(lambda: rates(c) == ["50Mbit", "50Mbit"], "worker 1's NIC to be reshaped both ways")
        _until(lambda: rates(c) == ["200Mbit", "200Mbit"], "worker 1's NIC to be restored both ways")
        assert runner.is_alive()  # restored by the episode's end, not by the job's
        runner.join(timeout=60)
        assert result.get("code") == 0, out.getvalue()
        assert "[episode] worker 1: nic restored to 200 Mbit/s" in out.getvalue()


def test_episodes_naming_no_worker_fail_before_anything_runs(name):
    with emulate.cluster([2], name=name):
        out = io.StringIO()
        with pytest.raises(ValueError, match=r"has workers 0\.\.1"):
            emulate.run(["sh", "-c", "echo ran"], name=name, out=out,
                        episodes=[emulate.parse_episode("2:cpu=0.5@0+1")])
        assert "ran" not in out.getvalue()


@pytest.mark.parametrize("bad", ["../../tmp/x", "x-y", "", "Dss", "a" * 13, "a b", "x/y", "1abc"])
def test_a_name_that_is_not_a_safe_name_is_refused_before_anything_is_touched(bad, tmp_path, monkeypatch):
    monkeypatch.setenv("DSSYNC_STATE_DIR", str(tmp_path / "state"))
    victim = tmp_path / "x.json"
    victim.write_text("{}")
    for call in (lambda: emulate.down(bad), lambda: emulate.up([1, 1], name=bad), lambda: emulate.load_state(bad),
                 lambda: emulate.contend(name=bad, clear=True)):
        with pytest.raises(ValueError, match="1-12 lowercase letters and digits"):
            call()
    assert victim.exists()


def test_down_removes_its_own_namespaces_and_no_other_with_its_prefix(name):
    others = [f"{name}-check-1", f"{name}-w0x", f"{name}-other", f"{name}x-w0"]
    try:
        for ns in others:
            subprocess.run(["ip", "netns", "add", ns], check=True)
        with emulate.cluster([1, 1], name=name) as c:
            assert sorted(emulate.leftovers(name)) == sorted(c.namespaces())
        present = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(ns in present for ns in others), present
        assert emulate.leftovers(name) == []
    finally:
        for ns in others:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_run_ends_when_a_worker_has_failed_whatever_a_stopped_one_does(name):
    with emulate.cluster([1, 1], name=name):
        out = io.StringIO()
        started = time.monotonic()
        code = emulate.run(["sh", "-c", 'if [ "$RANK" = 0 ]; then sleep 1; exit 3; else kill -STOP $$; fi'],
                           name=name, out=out, timeout_s=300)
        took = time.monotonic() - started
    assert code == 3 and took < 1 + emulate.FAILED_GRACE_S + 20, (code, took)


def test_killing_emulate_run_leaves_no_worker(name):
    import sys
    from pathlib import Path

    dssync = str(Path(sys.executable).parent / "dssync")
    with emulate.cluster([1, 1], name=name) as c:
        proc = subprocess.Popen([dssync, "emulate", "run", "--name", name, "--", "sleep", "600"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            def pids():
                return [p for ns in (c.worker_ns(0), c.worker_ns(1)) for p in subprocess.run(
                    ["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]
            while len(pids()) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(pids()) == 2
            proc.kill()
            proc.wait(timeout=10)
            deadline = time.monotonic() + 10
            while pids() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert pids() == []  # before `down` would have killed them
        finally:
            proc.kill()


@pytest.mark.parametrize("launcher", ["direct", "mpirun"])
def test_a_job_past_its_timeout_is_killed_and_the_message_names_the_worker_it_waited_on(name, launcher, tmp_path):
    """Past ``timeout_s`` the result is 124, nothing is left in the workers, and the output
    says which worker still ran what: here worker 1, whose copy sleeps, where worker 0's
    ended at once. Worker 1's copy marks when it started: on a loaded host a launcher can
    take that long to start it, and then the message cannot name the sleep yet."""
    up = tmp_path / "w1-up"
    with emulate.cluster([1, 1], name=name) as c:
        out = io.StringIO()
        started = time.time()
        code = emulate.run(["sh", "-c", 'if [ "$RANK$OMPI_COMM_WORLD_RANK" = 0 ]; then exit 0; fi; '
                            f'touch {up}; exec sleep 600'], name=name, out=out, timeout_s=10, launcher=launcher)
        left = [p for r in range(2) for p in subprocess.run(["ip", "netns", "pids", c.worker_ns(r)],
                                                              capture_output=True, text=True).stdout.split()]
    said = [line for line in out.getvalue().splitlines() if line.startswith("[emulate]")]
    assert code == 124 and left == [], (code, left, out.getvalue())
    assert len(said) == 1 and "within 10 s" in said[0], out.getvalue()
    up_before_timeout = up.exists() and up.stat().st_mtime < started + 9
    if launcher == "direct":
        assert up_before_timeout, "a copy started directly took 9 s to start"
        assert said[0].endswith("still running: w1"), said
        return
    # the launcher's daemon and the sleeping rank on worker 1; on worker 0 at most the daemon
    running = dict(part.split(": ", 1) for part in said[0].split("Still running: ")[1].split("; ") if ": " in part)
    assert "sleep" not in running.get("w0", ""), out.getvalue()
    if up_before_timeout:
        assert "sleep" in running.get("w1", ""), (out.getvalue(), up.stat().st_mtime - started)
