"""Real-process faults of ``dssync train``: a rank killed mid-run, the parent killed, the parent
terminated. The job ends with one line that names the rank that died first and how, and
nothing of it is left running.

The ranks are found as the children of the parent's fork server (multiprocessing's
``forkserver``, which forks every rank), in order of creation (rank order). How long the job took to notice is printed, not asserted
(timing belongs in benchmarks).
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

DSSYNC = str(Path(sys.executable).parent / "dssync")


def _children(parent: int) -> list[tuple[int, str]]:
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(parent)], capture_output=True, text=True).stdout
    return [(int(line.split()[0]), line) for line in out.splitlines() if line.strip()]


def _ranks(parent: int) -> list[int]:
    servers = [pid for pid, args in _children(parent) if "forkserver" in args]
    return sorted(pid for server in servers for pid, _ in _children(server))


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the job's rank ``rank``, which names itself ``dssync rank N``. (Not the
    N-th smallest pid: pids wrap around during a long suite, and a later rank may get a
    smaller one.)"""
    for pid in _ranks(parent):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == f"dssync rank {rank}":
                return pid
        except OSError:
            continue
    return None


def _as_from_a_terminal() -> None:
    """In the job's process before it runs dssync: SIGINT handled by default, as in a job
    started at a terminal that Ctrl-C can stop. A suite started in the background by a
    non-interactive shell (``make test &``, some CI runners) ignores SIGINT, every process
    it starts inherits that, and Python keeps an ignored SIGINT ignored: the signal tests
    would then wait for a job that never saw the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def _listening(pids: list[int] | None = None) -> set[int]:
    """TCP ports listening now (``ss -ltnp``), those of ``pids`` only when given."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    ports = set()
    for line in out.splitlines():
        fields = line.split()
        owners = {int(x) for x in re.findall(r"pid=(\d+)", line)}
        if pids is None or owners & set(pids):
            ports.add(int(fields[3].rsplit(":", 1)[1]))
    return ports


def _host_state() -> tuple[list[str], list[str]]:
    """Network namespaces and the cgroup tree (two levels): what an emulated job would leave."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    groups = sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/*") if p.is_dir())
    return sorted(x.split()[0] for x in netns if x.strip()), groups


@pytest.fixture
def nothing_left():
    """Starts the test's job (``start(*args)``) in a process group of its own and, after the
    test, whatever its outcome, kills that group; then checks that no process of the job is
    left, no port it listened on is open, and no namespace or cgroup was added."""
    before = _host_state()
    job: dict[str, object] = {"pids": [], "ports": set(), "procs": []}

    def start(*args: str, nproc: int = 4, training: Path | None = None,
              spawned: int | None = None) -> tuple[subprocess.Popen, list[int]]:
        """``training``: a checkpoint folder the job writes to every few iterations; then the
        job counts as started once its first checkpoint is there (training runs).
        ``spawned``: return as soon as that many ranks exist (the job is still starting)."""
        proc = subprocess.Popen([DSSYNC, "train", "--nproc", str(nproc), "--task", "digits", "--steps", "1000000",
                                 "--eval-every", "1000000", "--timeout", "60", "--no-progress", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_as_from_a_terminal)
        job["procs"].append(proc)
        if spawned is not None:
            ranks = _await(lambda: _ranks(proc.pid) if len(_ranks(proc.pid)) >= spawned else None, proc,
                           f"{spawned} ranks of `dssync train {' '.join(args)}` to start", poll=0.005)
            job.update(pids=[proc.pid, *ranks])
            return proc, ranks
        ranks = _await(lambda: _ranks(proc.pid) if len(_ranks(proc.pid)) == nproc else None, proc,
                       f"{nproc} ranks of `dssync train {' '.join(args)}` to start")
        # Every rank listens once its process group is up: from then on a rank that dies is
        # a peer the others lose, not a job that failed to start.
        _await(lambda: all(_listening([r]) for r in ranks) or None, proc,
               f"every rank of {ranks} to listen on a port (its process group up)")
        job.update(pids=[proc.pid, *ranks], ports=_listening([proc.pid, *ranks]))
        if training is not None:
            _await(lambda: (training / "latest.json").exists() or None, proc,
                   f"the first checkpoint in {training} (training under way)")
        return proc, ranks

    yield start
    for proc in job["procs"]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group outlives its leader: ranks left behind
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
    pids = list(job["pids"])
    assert _wait_gone(pids) == [], f"processes {pids} of the job are still running"
    assert not (set(job["ports"]) & _listening()), f"ports {sorted(job['ports'])} of the job still listen"
    assert _host_state() == before


def _await(condition, proc: subprocess.Popen, what: str, seconds: float = 180, poll: float = 0.2):
    """``condition()``'s first value that is not ``None``, polled until ``seconds`` pass; the
    job ending first, or the deadline, fails the test saying what was awaited."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value is not None:
            return value
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the job ended (exit {proc.returncode}) while waiting for {what}: {err.strip()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds:.0f} s for {what}")
        time.sleep(poll)


def _wait_gone(pids: list[int], seconds: float = 15) -> list[int]:
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _alive(pids)


@pytest.mark.parametrize("strategy", ["ds-sync", "ddp", "allreduce", "asp", "psp", "sync-switch"])
def test_a_killed_rank_is_named_and_the_job_ends(strategy, nothing_left):
    proc, ranks = nothing_left("--strategy", strategy)
    rank2 = _await(lambda: _rank_pid(proc.pid, 2), proc, "rank 2 to name itself")
    killed_at = time.monotonic()
    os.kill(rank2, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    print(f"{strategy}: the job ended {time.monotonic() - killed_at:.1f} s after rank 2 was killed")
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dssync train: error: rank 2 died (killed by SIGKILL)"), lines[0]
    assert _wait_gone(ranks) == []


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "SIGINT twice", "SIGTERM twice"])
def test_the_ranks_end_with_their_parent(how, nothing_left, tmp_path):
    # Signalled while training runs (a Ctrl-C while the ranks start: the test below).
    proc, ranks = nothing_left("--strategy", "ds-sync", "--checkpoint", str(tmp_path / "c"),
                               "--checkpoint-every", "20", training=tmp_path / "c")
    if how.endswith("twice"):
        sig = getattr(signal, how.split()[0])
        proc.send_signal(sig)
        time.sleep(0.2)
        proc.send_signal(sig)
    else:
        proc.send_signal(getattr(signal, how))
    stopped_at = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    left = _wait_gone(ranks)
    print(f"{how}: parent ended and ranks gone {time.monotonic() - stopped_at:.1f} s after the signal")
    assert left == [], f"ranks {left} outlived the parent ({how})"
    if how != "SIGKILL":  # a second Ctrl-C or SIGTERM may end it by the signal itself
        assert proc.returncode in (130, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM), (proc.returncode, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_ctrl_c_while_the_ranks_start_ends_the_job_and_every_rank(nothing_left):
    """Ctrl-C while the parent is still starting its ranks: the ones already started end
    with it, and none is left waiting for peers that were never started."""
    proc, started = nothing_left("--strategy", "ds-sync", spawned=1)
    proc.send_signal(signal.SIGINT)
    stopped_at = time.monotonic()
    _, err = proc.communicate(timeout=60)
    print(f"the job ended {time.monotonic() - stopped_at:.1f} s after Ctrl-C, {len(started)} rank(s) started by then")
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err)
    assert err.strip().splitlines() == ["dssync train: interrupted"], err
    assert _wait_gone(started) == []
