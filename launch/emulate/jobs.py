"""Running a job on the emulated cluster: one copy of a command per worker, in its namespace
(``run``), or a whole ``dssync`` command through the CLI (``run_dssync``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .contention import cpu_cgroup
from .episodes import Episode, Episodes, check_episodes
from .forked import ForkedWorker, forkable
from .launchers import LAUNCHERS, launcher_argv, launcher_env, workdir
from .state import DEFAULT_NAME, MASTER_PORT, EmulationError, load_state


# -- run -------------------------------------------------------------------------------------
def _run_launcher(c, launcher: str, command: Sequence[str], timeout_s: float | None, out) -> int:
    """``command`` under ``launcher`` (mpirun, horovodrun) from the sink namespace; its output
    prefixed ``[<launcher>]``; 124 past ``timeout_s`` (the launcher and every rank killed)."""
    with workdir() as tmp:
        env = launcher_env(launcher, Path(tmp))
        argv = ["setpriv", "--pdeathsig", "KILL", "ip", "netns", "exec", c.sink_ns, "env",
                *(f"{k}={v}" for k, v in env.items()), *launcher_argv(c, launcher, command, Path(tmp))]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                start_new_session=True)

        def pump() -> None:
            for line in proc.stdout:
                out.write(f"[{launcher}] {line}")
                out.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # which worker the job waited on: what each still runs (no rank at all: the
            # launcher never started it there)
            out.write(f"[emulate] {launcher} did not finish within {timeout_s:g} s; killing it and every rank. "
                      f"Still running: {_still_running(c)}\n")
            out.flush()
            return 124
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            _kill_ranks(c)
            reader.join(timeout=5)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _job_pids(c) -> dict[int, list[int]]:
    """The processes in each worker's namespace that belong to the job: anything but the
    background flows' processes."""
    keep = {pid for f in c.flows for pid in f.get("pids", [])}
    out = {}
    for rank in range(c.world_size):
        pids = subprocess.run(["ip", "netns", "pids", c.worker_ns(rank)], capture_output=True, text=True).stdout
        out[rank] = [int(pid) for pid in pids.split() if int(pid) not in keep]
    return out


def _still_running(c) -> str:
    """What each worker still runs of the job (``w0: orted, dssync``), for the timeout's message."""
    def comm(pid: int) -> str:
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/comm").read_text().strip()
        return ""

    running = {rank: sorted({comm(pid) for pid in pids} - {""}) for rank, pids in _job_pids(c).items()}
    return "; ".join(f"w{rank}: {', '.join(names)}" for rank, names in running.items() if names) or "nothing"


def _kill_ranks(c) -> None:
    """Ranks a launcher started in the workers' namespaces and left behind (a launcher
    killed at the timeout cannot reap them)."""
    for pids in _job_pids(c).values():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def run_dssync(name: str, args: Sequence[str], out: Path, *, timeout_s: float,
               episodes: Sequence[Episode] = ()) -> Any:
    """``dssync emulate run --name NAME [--episode SPEC ...] -- dssync ARGS...`` as a
    subprocess; the JSON that rank 0 wrote to ``out``. A failing job raises with the tail of
    its output."""
    dssync = str(Path(sys.executable).with_name("dssync"))
    episode_args = [a for e in episodes for a in ("--episode", str(e))]
    proc = subprocess.run([dssync, "emulate", "run", "--name", name, "--timeout", str(timeout_s), *episode_args, "--",
                           dssync, *args], capture_output=True, text=True, timeout=timeout_s + 60)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise EmulationError(f"dssync {' '.join(args)} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(Path(out).read_text())


#: Seconds the other workers of a job get to end after one has failed, before they are killed.
FAILED_GRACE_S = 10.0


def run(command: Sequence[str], *, name: str = DEFAULT_NAME, timeout_s: float | None = None,
        out=None, episodes: Sequence[Episode] = (), launcher: str = "direct") -> int:
    """Run ``command`` once per worker in its namespace; stream ``[w<i>]``-prefixed output.

    Once a copy has failed (a non-zero exit), the others have ``FAILED_GRACE_S`` to end, then
    are killed, whatever they are doing (stopped, hung), and the first failure's code is the
    result. Each copy dies with this process.

    Each copy gets RANK, WORLD_SIZE, LOCAL_RANK (0: one worker per emulated host),
    MASTER_ADDR (worker 0), MASTER_PORT, GLOO_SOCKET_IFNAME=eth0 and DSSYNC_HOST. Returns
    the worst exit code (a signal counts as 128 + its number); past ``timeout_s`` every copy
    is killed and the result is 124.

    ``episodes`` (transient stragglers) take effect at their times after launch, each change
    written to ``out`` as an ``[episode]`` line; however the job ends, what is still on is
    undone before ``run`` returns. A worker with a CPU episode runs in its CPU cgroup from
    the start (uncapped until the episode, unless ``contend`` capped it).

    ``launcher`` ``mpirun`` or ``horovodrun`` starts ``command`` under that launcher instead,
    from the spine's host, which reaches each worker through its remote shell
    (``launchers``); the launcher's exit code is the result.
    """
    if not command:
        raise ValueError("nothing to run: give the command after `--`")
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; choose one of: {', '.join(LAUNCHERS)}")
    c = load_state(name)
    check_episodes(c, episodes)
    if launcher != "direct" and episodes:
        raise ValueError(f"--episode needs the direct launch (dssync emulate run without --launcher {launcher})")
    out = out or sys.stdout
    if launcher != "direct":
        return _run_launcher(c, launcher, command, timeout_s, out)
    lock = threading.Lock()

    def write(text: str) -> None:
        with lock:
            out.write(text)
            out.flush()

    stragglers = Episodes(c, episodes, write)
    stragglers.prepare()
    in_cgroup = set(c.cpu_limit) | set(stragglers.cpu_ranks)
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []

    def pump(rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            write(f"[w{rank}] {line}")

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    timed_out = False
    fork = forkable(command)
    try:
        for rank in range(c.world_size):
            env = {"RANK": str(rank), "WORLD_SIZE": str(c.world_size), "LOCAL_RANK": "0",
                   "MASTER_ADDR": c.worker_addr(0), "MASTER_PORT": str(MASTER_PORT),
                   "GLOO_SOCKET_IFNAME": "eth0", "DSSYNC_HOST": f"w{rank}"}
            # The namespaces have no resolver; c10d would warn about it on every connection.
            env.setdefault("TORCH_CPP_LOG_LEVEL", os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"))
            cgroup = cpu_cgroup(c.name, rank) if rank in in_cgroup else None
            if fork:  # every worker forked before any thread starts here
                procs.append(ForkedWorker(command, netns=c.worker_ns(rank), env=env, cgroup=cgroup))
                continue
            argv = ["ip", "netns", "exec", c.worker_ns(rank), "env",
                    *(f"{k}={v}" for k, v in env.items()), *command]
            if cgroup is not None:  # joins the worker's cgroup, then becomes the command (which
                # inherits it); outside the namespace, whose own /sys has no cgroup mount
                argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *argv]
            # The worker dies with this process, even killed by SIGKILL (util-linux's setpriv
            # sets PR_SET_PDEATHSIG, which every exec after it keeps).
            argv = ["setpriv", "--pdeathsig", "KILL", *argv]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, bufsize=1, start_new_session=True))
        stragglers.start()
        for rank, proc in enumerate(procs):
            threads.append(threading.Thread(target=pump, args=(rank, proc), daemon=True))
            threads[-1].start()
        failed_at, gave_up = None, False
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if deadline is not None and now > deadline:
                timed_out = True
                break
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = now  # the job has failed: the others get FAILED_GRACE_S to say why
                first = next(p.returncode for p in procs if p.returncode not in (None, 0))
            if failed_at is not None and now > failed_at + FAILED_GRACE_S:
                gave_up = True  # a worker that hangs or is stopped does not keep the job alive
                break
            time.sleep(0.1)
    finally:
        still = [rank for rank, p in enumerate(procs) if p.poll() is None]
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        stragglers.stop()
        for t in threads:
            t.join(timeout=5)
    if timed_out:
        write(f"[emulate] the job did not finish within {timeout_s:g} s; killed the workers still running: "
              f"{', '.join(f'w{r}' for r in still) or 'none'}\n")
        return 124
    if gave_up:  # the first failure is the job's, not the kills that followed it
        return first if first >= 0 else 128 - first
    codes = [p.returncode if p.returncode >= 0 else 128 - p.returncode for p in procs]
    return max(codes)
