"""Run a function on every rank of a world: spawn local ranks, or be one under a launcher.

``run_ranks(fn, *args, nproc=N)`` starts ``N`` processes, joins them in one gloo world on
loopback and calls ``fn(comm, *args)`` in each. They are forked by multiprocessing's fork
server, a single-threaded process that imported torch once (``forkserver``, never ``fork``
from the job itself: torch and threads), so that a rank starts in a fraction of a second
instead of importing torch again (1-2 s of CPU per rank, most of an 8-rank job's start on
a small machine). Each rank takes the job's environment, working directory, stdout and
stderr as they are when it starts, as a fresh process would. A rank that raises, dies or
hangs past the timeout stops the whole job: the others are terminated and the first
failure is raised with its rank.
Under a launcher (torchrun, ``dssync emulate run``, mpirun, horovodrun) the same call runs
just this rank, on the collective library ``backend`` names: ``torch`` (torch.distributed),
``mpi`` (mpi4py) or ``horovod`` (Horovod process sets). Spawning local ranks is
torch.distributed's; MPI and Horovod jobs are started by their launchers.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import random
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from dssync.errors import DssyncError
from dssync.launch.env import LaunchEnv, from_environ

__all__ = ["BACKENDS", "free_port", "run_ranks"]

BACKENDS = ("torch", "mpi", "horovod")


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel hands out to outgoing connections (``ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and outside the range the kernel gives
    outgoing connections, so that no other process's connection takes it before the
    rendezvous listens on it. A port the kernel picks (bind to 0) is from that range, and on
    a loaded machine another job's connection once got it in the second between the pick
    and rank 0's listen (``EADDRINUSE``, in a CI run of the test suite with three workers).
    Random among the ports below the range (above it where there is more room), a bound
    check each, 100 tries; then the kernel's pick."""
    low, high = _ephemeral_ports()
    below, above = (10000, low - 1), (high + 1, 65535)
    start, end = below if below[1] - below[0] >= above[1] - above[0] else above
    rng = random.SystemRandom()
    for _ in range(100 if end > start else 0):
        port = rng.randint(start, end)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup_rank(rank: int, world_size: int, init_method: str, timeout_s: float) -> Any:
    import torch

    from dssync.collectives.torch_dist import TorchCommunicator, init_process_group

    torch.set_num_threads(1)  # ranks share the machine's cores; one thread each
    init_process_group(rank=rank, world_size=world_size, init_method=init_method, timeout_s=timeout_s)
    return TorchCommunicator(timeout_s=timeout_s)


def _setup_launched(env: LaunchEnv, backend: str, timeout_s: float) -> Any:
    if backend == "torch":
        return _setup_rank(env.rank, env.world_size, env.torch_init_method(), timeout_s)
    import torch

    torch.set_num_threads(1)
    if backend == "mpi":
        from dssync.collectives.mpi import MPICommunicator

        comm = MPICommunicator(timeout_s=timeout_s)
    else:
        from dssync.collectives.horovod import HorovodCommunicator

        comm = HorovodCommunicator(timeout_s=timeout_s)
    if (comm.rank, comm.world_size) != (env.rank, env.world_size):
        raise DssyncError(
            f"--backend {backend} sees rank {comm.rank} of {comm.world_size} but the {env.launcher} "
            f"environment says rank {env.rank} of {env.world_size}; launch with the library's own launcher"
        )
    return comm


def _one_line(message: str, limit: int = 300) -> str:
    """The first line of a message from a library (gloo's carry C++ traces), at most ``limit`` long."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _first_dead(procs: list[Any], reported: set[int], wait_s: float = 1.0) -> int | None:
    """A rank whose process has ended without reporting, if one has or does within
    ``wait_s``: when a rank fails because a peer's connection closed, the peer is the cause.
    Of several, one a signal killed (``_culprit``)."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [r for r, p in enumerate(procs) if r not in reported and p.exitcode not in (None, 0)]
        if dead or time.monotonic() > deadline:
            return _culprit(procs, dead)
        time.sleep(0.05)


def _culprit(procs: list[Any], dead: list[int]) -> int | None:
    """Of the ranks ``dead`` (ended, no result read yet), the one to name: the lowest a signal
    killed, else the lowest. A rank that exited with a code ran its own error handling, most
    likely on noticing a dead peer, and its report may still be in flight: with rank 2 killed
    by SIGKILL, rank 0 exited 1 on the closed connection and was named in its place."""
    killed = [r for r in dead if (procs[r].exitcode or 0) < 0]
    return (killed or dead or [None])[0]


def _teardown(backend: str = "torch") -> None:
    if backend == "horovod":
        import horovod.torch as hvd

        with contextlib.suppress(Exception):
            hvd.shutdown()
        return
    import torch.distributed as dist

    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _parent_of(pid: int) -> int | None:
    """The parent of process ``pid`` (``/proc``; None where there is none to read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def die_with_parent(parent: int) -> None:
    """End this rank with its job ``parent``, and now if the job is already gone: a rank
    never outlives its job.

    The kernel SIGKILLs the rank when the process that started it exits (Linux
    ``PR_SET_PDEATHSIG``). That is the job itself, or the job's fork server, which outlives
    the job while any rank it forked lives; so a daemon thread also waits for the job to
    end (a pidfd, where Linux has them; elsewhere a poll every second) and then kills the
    rank the same way.
    """
    if sys.platform == "linux":
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(parent)
    ppid = os.getppid()
    if ppid != parent and _parent_of(ppid) != parent:  # checked after the pidfd: it is the job's
        os._exit(1)
    if ppid == parent:  # started by the job itself: the kernel's signal is enough
        if pidfd is not None:
            os.close(pidfd)
        return

    def watch() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while _parent_of(os.getppid()) == parent:
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name=f"dssync-job-{parent}", daemon=True).start()


def how_it_ended(exitcode: int | None) -> str:
    """``killed by SIGKILL``, ``exit code 3``: how a child process ended."""
    if exitcode is not None and exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


class _Stdio:
    """The job's file descriptors 1 and 2 as they are now, handed to a rank with its
    arguments (as multiprocessing sends a socket), as a spawned process would inherit them:
    a fork server's own are the job's when the server started, and the job may have
    redirected its own since."""

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.reduction import DupFd

        return _Stdio._adopt, (DupFd(1), DupFd(2))

    @staticmethod
    def _adopt(out: Any, err: Any) -> None:
        for wrapped, target in ((out, 1), (err, 2)):
            fd = wrapped.detach()
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)


def _stdio() -> _Stdio | None:
    """The job's stdio for a rank; None where fd 1 or 2 is closed (the rank keeps its own)."""
    try:
        os.fstat(1), os.fstat(2)
    except OSError:
        return None
    return _Stdio()


def _child(rank: int, world_size: int, init_method: str, timeout_s: float,
           fn: Callable[..., Any], args: tuple[Any, ...], results: Any, parent: int,
           environ: dict[str, str] | None = None, cwd: str | None = None, stdio: Any = None) -> None:
    # ``stdio`` has already taken the job's stdout and stderr in unpickling (``_Stdio``).
    die_with_parent(parent)
    # Named for ps and top ("dssync rank 2"), where every rank is otherwise one more python.
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w") as comm_file:
            comm_file.write(f"dssync rank {rank}"[:15])
    if environ is not None:  # the fork server's were the job's when the server started
        os.environ.clear()
        os.environ.update(environ)
    if cwd is not None:
        os.chdir(cwd)
    try:
        comm = _setup_rank(rank, world_size, init_method, timeout_s)
        # Pickle here, not in the queue's feeder thread, where a failure would be lost.
        value = pickle.dumps(fn(comm, *args))
        # Nobody tears down while a peer still completes gloo's connection handshake or its
        # last receives: a rank of a job that ran no collective, gone early, now and then
        # ended its peer's join with "Connection closed by peer". This rank's own work is done,
        # so a peer that fails here is that peer's failure to report, not this rank's.
        with contextlib.suppress(Exception):
            comm.barrier()
        results.put((rank, True, value, ""))
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        message = str(exc) if isinstance(exc, DssyncError | ValueError) else f"{type(exc).__name__}: {exc}"
        results.put((rank, False, message, traceback.format_exc()))
        # The failure is the job's one message: leave now, once it is sent. Tearing the group
        # down while the peers still wait in a collective, or letting the interpreter run the
        # library's destructors with its threads alive, now and then printed "terminate called
        # without an active exception" beside it; the parent ends the other ranks.
        results.close()
        results.join_thread()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    _teardown()


def run_ranks(
    fn: Callable[..., Any],
    *args: Any,
    nproc: int | None,
    timeout_s: float = 300.0,
    job_timeout_s: float | None = None,
    backend: str = "torch",
) -> list[Any]:
    """Run ``fn(comm, *args)`` on every rank; return the results by rank.

    Under a launcher, ``nproc`` must be ``None`` or the launcher's world size, and the
    list holds only this rank's result (at its index; the others are ``None``).
    ``timeout_s`` bounds every collective; ``job_timeout_s`` bounds the whole job.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    launched = from_environ()
    if launched is not None:
        return _run_launched(launched, fn, args, nproc, timeout_s, backend)
    if backend != "torch":
        launcher = "mpirun -np N" if backend == "mpi" else "horovodrun -np N --gloo (or --mpi)"
        raise DssyncError(f"--backend {backend} runs one rank per process under its launcher; start the "
                          f"job with {launcher} ... --backend {backend} (without a launcher, use --backend torch)")
    if nproc is None or nproc < 1:
        raise ValueError(f"--nproc must be a positive number of local ranks, got {nproc}")
    _check_room(nproc)
    return _spawn(fn, args, nproc, timeout_s, job_timeout_s)


#: Memory one spawned rank takes at least (a process that has imported torch and joined gloo).
RANK_MB = 300


def _check_room(nproc: int) -> None:
    """Refuse, before starting any, more local ranks than this host's available memory holds."""
    try:
        with open("/proc/meminfo") as f:
            available_mb = next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return  # not Linux, or no figure: nothing to check against
    if nproc * RANK_MB > available_mb:
        raise ValueError(f"--nproc {nproc}: {nproc} local ranks need about {nproc * RANK_MB / 1024:.0f} GiB "
                         f"({RANK_MB} MB each) and {available_mb / 1024:.1f} GiB is available; spawn at most "
                         f"{max(1, available_mb // RANK_MB)}, or start the job across hosts with a launcher")


def _run_launched(env: LaunchEnv, fn: Callable[..., Any], args: tuple[Any, ...],
                  nproc: int | None, timeout_s: float, backend: str) -> list[Any]:
    if nproc is not None and nproc != env.world_size:
        raise ValueError(
            f"--nproc {nproc} does not match the {env.launcher} world of {env.world_size} ranks; "
            "drop --nproc under a launcher"
        )
    comm = _setup_launched(env, backend, timeout_s)
    try:
        out: list[Any] = [None] * env.world_size
        out[env.rank] = fn(comm, *args)
        comm.barrier()  # nobody tears down while a peer's last sends are still in flight
        return out
    finally:
        _teardown(backend)


@contextlib.contextmanager
def _signals_deferred() -> Any:
    """Hold SIGINT and SIGTERM for the block and act on them when it ends. Starting a rank
    writes its whole start-up state to it; cut short, the rank dies reading it and the
    parent has not yet counted it among the ranks it must end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    saved = {sig: signal.signal(sig, lambda signum, frame: held.append(signum))
             for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)  # now, under the handler that was in place


def _spawn(fn: Callable[..., Any], args: tuple[Any, ...], nproc: int,
           timeout_s: float, job_timeout_s: float | None) -> list[Any]:
    ctx = mp.get_context("forkserver")
    # Imported once, by the server; a module the server cannot import is imported by each rank.
    # torch._dynamo too: torch.optim imports it when the first optimizer is made, and in each
    # rank that cost about 2 s of CPU, most of a short job's (a 2-step job at 4 ranks took
    # 9.5 CPU-seconds, 0.35 with it preloaded).
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "dssync.collectives.torch_dist",
                                getattr(fn, "__module__", None) or "dssync.launch.spawn"])
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")}
    out: list[Any] = [None] * nproc
    done: set[int] = set()
    failure: tuple[int, str, str] | None = None
    deadline = None if job_timeout_s is None else time.monotonic() + job_timeout_s
    finished = False
    procs: list[Any] = []
    try:
        # Started inside the try: a Ctrl-C while the later ranks start still ends the earlier ones.
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # local ranks talk over loopback only
        try:
            for r in range(nproc):
                proc = ctx.Process(target=_child, name=f"dssync-rank{r}",
                                   args=(r, nproc, init_method, timeout_s, fn, args, results, os.getpid(),
                                         dict(os.environ), os.getcwd(), _stdio()))
                with _signals_deferred():
                    proc.start()
                    procs.append(proc)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        while len(done) < nproc and failure is None:
            try:
                rank, ok, value, tb = results.get(timeout=0.2)
            except queue.Empty:
                r = _culprit(procs, [r for r, p in enumerate(procs) if r not in done and not p.is_alive()])
                if r is not None:
                    # Gone without a result (killed, segfault, os._exit): give a message
                    # still in flight a moment before calling it dead.
                    time.sleep(1.0)
                    if results.empty():
                        failure = (r, f"rank {r} died ({how_it_ended(procs[r].exitcode)}) without a result", "")
                if deadline is not None and time.monotonic() > deadline:
                    missing = sorted(set(range(nproc)) - done)
                    failure = (missing[0], f"job did not finish within {job_timeout_s:.0f} s; "
                               f"ranks {missing} still running", "")
                continue
            if ok:
                out[rank] = pickle.loads(value)
                done.add(rank)
            else:
                failure = (rank, value, tb)
                done.add(rank)
                dead = _first_dead(procs, done)
                if dead is not None:  # a peer died first; this rank only noticed
                    seen = _one_line(value).removeprefix(f"rank {rank}: ")
                    failure = (dead, f"rank {dead} died ({how_it_ended(procs[dead].exitcode)}); then rank "
                               f"{rank}: {seen}", tb)
        finished = failure is None
    finally:
        try:
            # Anything but a clean finish (a failure, Ctrl-C, SIGTERM) ends every rank at once.
            if not finished:
                for p in procs:
                    if p.is_alive():
                        p.terminate()
            for p in procs:
                p.join(timeout=10 if finished else 2)
                if p.is_alive():
                    p.kill()
                    p.join()
        except BaseException:
            # A second Ctrl-C or SIGTERM while the ranks are ending: end them now. Left
            # running, multiprocessing would wait for them when this process exits.
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join(timeout=5)
            raise
    if failure is not None:
        rank, message, tb = failure
        if os.environ.get("DSSYNC_DEBUG"):
            print(tb)
        message = _one_line(message, limit=600)
        raise DssyncError(message if message.startswith("rank ") else f"rank {rank}: {message}")
    return out
