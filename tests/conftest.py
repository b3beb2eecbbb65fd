"""Suite-wide: nothing the suite starts outlives it.

Every process started during the session inherits ``DSSYNC_TEST_SESSION`` from this one,
also through launchers, new sessions and network namespaces. At the end, any process that
still carries it (an orphaned rank, a launcher, a background iperf3) is listed, ended, and
fails the run.
"""

import os
import signal
import time
import uuid
from pathlib import Path

MARK = "DSSYNC_TEST_SESSION"


def pytest_configure(config):
    os.environ.setdefault(MARK, uuid.uuid4().hex)


def _marked() -> dict[int, str]:
    """Live processes (not zombies) other than this one whose environment holds this session's mark."""
    needle = f"{MARK}={os.environ[MARK]}".encode()
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        # multiprocessing's resource tracker and fork server of this process end when it does
        if state == "Z" or (int(ppid) == os.getpid() and ("resource_tracker" in cmdline or "forkserver" in cmdline)):
            continue
        found[pid] = cmdline
    return found


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    left = _marked()
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:  # a job's last processes may still be exiting
        time.sleep(0.2)
        left = _marked()
    if not left:
        return
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    listed = "\n".join(f"  {pid}: {cmd[:200]}" for pid, cmd in sorted(left.items()))
    session.config.get_terminal_writer().line(f"\nprocesses the suite started are still running (now killed):\n{listed}",
                                              red=True)
    session.exitstatus = 1
