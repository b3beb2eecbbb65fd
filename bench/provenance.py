"""Where a measurement came from: the code, the command, the date and the machine.

Every record ``dssync bench`` writes carries this (JSON: a ``provenance`` key; markdown: its
first line), so that a figure can be traced to the commit that produced it and re-measured
when the code it measures changes.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["markdown_line", "provenance", "stamp", "write_module_record"]


_HERE = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_HERE), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def congestion_control() -> str | None:
    """This network namespace's TCP congestion control, ``None`` where unreadable."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip() or None
    except OSError:
        return None


def cpu_model() -> str | None:
    """The processor's model name (``/proc/cpuinfo``), ``None`` where unreadable: machines
    of one size differ in speed, and the emulated cluster's timings and busy-host noise with
    them."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return None


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """The commit of the installed checkout (``None`` outside one; ``dirty`` when files it
    tracks, outside ``bench/results/``, differ from it), the command as typed (``dssync`` and
    its arguments), the UTC date, the machine's cores (those this process may run on), its
    processor's model and Python, and its TCP congestion control (``None`` where unreadable): the emulated
    cluster's namespaces take the machine's, and how a flow through another job's queue
    fares depends on it (``results/busy-ingress.json``)."""
    from importlib.metadata import PackageNotFoundError, version

    argv = sys.argv[1:] if argv is None else argv
    commit = _git("rev-parse", "HEAD")
    # The records a bench run writes (bench/results/) are its output, not the code it measured.
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                  ":(top,exclude)bench/results") if commit else None
    try:
        dssync_version = version("dssync")
    except PackageNotFoundError:
        dssync_version = None
    return {
        "commit": commit,
        "dirty": bool(status),
        "command": shlex.join(["dssync", *argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)),
        "cpu": cpu_model(),
        "python": sys.version.split()[0],
        "tcp_congestion_control": congestion_control(),
        "dssync": dssync_version,
    }


def markdown_line(prov: dict[str, Any]) -> str:
    """The first line of a markdown record: commit, date, cores and the command."""
    commit = (prov.get("commit") or "unknown")[:12] + (" (with uncommitted changes)" if prov.get("dirty") else "")
    return (f"Measured at commit {commit} on {prov.get('date')}, {prov.get('cores')} cores: "
            f"`{prov.get('command')}`")


def stamp(records: Any, prov: dict[str, Any] | None = None) -> Any:
    """``records`` with ``provenance`` added: to every record of a list, or to the one record.
    A record that carries one already keeps it (a run kept from an earlier, resumed measurement
    was measured by the code that record names)."""
    prov = provenance() if prov is None else prov
    if isinstance(records, list):
        return [{**r, "provenance": r.get("provenance", prov)} if isinstance(r, dict) else r for r in records]
    if isinstance(records, dict):
        return {**records, "provenance": records.get("provenance", prov)}
    return records


def write_module_record(path: str | Path, record: dict[str, Any], module: str, argv: list[str] | None) -> None:
    """Write ``record`` as JSON to ``path``, with the provenance of ``python -m module`` run
    with ``argv`` (``None``: this process's arguments); for the benches run as modules."""
    argv = sys.argv[1:] if argv is None else argv
    out = {**record, "provenance": provenance(["python", "-m", module, *argv])}
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
