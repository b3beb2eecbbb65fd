"""When ``dssync emulate run`` forks its workers instead of exec'ing them (``forkable``)."""

import sys
import threading
from pathlib import Path

from dssync.launch.emulate.forked import forkable

DSSYNC = str(Path(sys.executable).with_name("dssync"))


def test_this_installations_dssync_is_forked_by_default(monkeypatch):
    monkeypatch.delenv("DSSYNC_EMULATE_FORK", raising=False)
    assert forkable([DSSYNC, "probe"])
    monkeypatch.setenv("DSSYNC_EMULATE_FORK", "1")
    assert forkable([DSSYNC, "train", "--steps", "3"])


def test_exec_where_asked_or_where_a_fork_could_not_run_the_command(monkeypatch, tmp_path):
    monkeypatch.delenv("DSSYNC_EMULATE_FORK", raising=False)
    assert not forkable([sys.executable, "-c", "pass"])  # not dssync: exec'd as typed
    assert not forkable([])
    other = tmp_path / "dssync"  # a dssync of another installation
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    assert not forkable([str(other), "probe"])
    monkeypatch.setenv("DSSYNC_EMULATE_FORK", "0")
    assert not forkable([DSSYNC, "probe"])


def test_a_caller_with_a_thread_running_execs(monkeypatch):
    monkeypatch.delenv("DSSYNC_EMULATE_FORK", raising=False)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not forkable([DSSYNC, "probe"])  # a fork would copy one thread of two
    finally:
        stop.set()
        thread.join()
