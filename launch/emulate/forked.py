"""Workers forked from ``dssync emulate run`` itself, for a command that is ``dssync``.

Each worker of ``dssync emulate run -- dssync ...`` would otherwise be a new Python that
imports torch (some 2 s of CPU each: 8 workers on 2 cores waited 8-9 s before the first
message, 16 twice that). ``emulate run`` has imported torch already (the CLI did), so it
forks the workers instead, as torch's forkserver does for ``--nproc`` ranks: each child
joins its worker's network namespace (``setns``, what ``ip netns exec`` does), its CPU
cgroup where it has one, takes the worker's environment, and runs the CLI's ``main`` in a
session of its own, its output through a pipe to the parent's ``[w<i>]`` prefixer. The
children are forked before the parent starts any thread, after ``gc.freeze()`` (the
collector then leaves the inherited objects alone instead of copying their pages).

The default since the probe judges its own answers (passes until the racks settle, flags
with their own confidence): an 8-worker probe's start-up fell from about 28 s to 3 s, and
the emulated probe tests and ``bench probe-layouts`` came out no worse forked than exec'd
(docs/probing.md has the figures). Before that, forked workers' probes had come out
noisier in one run of the test suite (4 of the 8 probe cases split a rack or missed a
flag), likely the copy-on-write of the inherited heap during the first seconds of the job.
``DSSYNC_EMULATE_FORK=0`` exec's each worker through ``ip netns exec`` as a fresh process,
as it does anyway when the command is not this installation's ``dssync``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import shutil
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO

__all__ = ["ForkedWorker", "forkable"]

_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_NETNS_DIR = Path("/run/netns")


def forkable(command: Sequence[str]) -> bool:
    """Whether ``command`` is this installation's ``dssync`` console script."""
    if os.environ.get("DSSYNC_EMULATE_FORK", "1") == "0" or not command:
        return False
    if threading.active_count() > 1:  # a fork copies one thread: only from a single-threaded caller
        return False
    found = shutil.which(command[0])
    mine = Path(sys.executable).with_name("dssync")
    return found is not None and mine.exists() and Path(found).resolve() == mine.resolve()


class ForkedWorker:
    """A forked worker with the ``Popen`` interface ``jobs.run`` uses: ``pid`` (also its
    process group), ``stdout``, ``poll``, ``wait``, ``returncode``."""

    def __init__(self, command: Sequence[str], *, netns: str, env: dict[str, str], cgroup: Path | None) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        ns_fd = os.open(_NETNS_DIR / netns, os.O_RDONLY)
        read_end, write_end = os.pipe()
        gc.freeze()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                os.close(read_end)
                os.setsid()
                libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                if libc.setns(ns_fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into network namespace {netns}")
                os.close(ns_fd)
                if cgroup is not None:
                    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
                os.environ.update(env)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(write_end, 1)
                os.dup2(write_end, 2)
                os.close(write_end)
                sys.stdout = os.fdopen(1, "w", buffering=1)
                sys.stderr = os.fdopen(2, "w", buffering=1)
                sys.argv = list(command)
                from dssync.cli import main

                code = main(list(command[1:]))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 - the worker reports and exits, never returns
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        os.close(write_end)
        os.close(ns_fd)
        self.pid = pid
        self.stdout: IO[str] = os.fdopen(read_end, "r", buffering=1)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode
