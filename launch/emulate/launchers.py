"""Jobs on the emulated cluster under the launchers people use: ``mpirun`` and ``horovodrun``.

``dssync emulate run --launcher mpirun -- CMD`` starts Open MPI's ``mpirun`` on the spine's
host (the sink namespace, as a login node would) with one slot on each worker's address;
``--launcher horovodrun`` does the same with ``horovodrun --gloo``. Each launcher reaches a
"remote" host the way it reaches one on a real cluster, through its remote shell, which
here is ``python -m dssync.launch.emulate.agent`` (Open MPI's ``plm_rsh_agent``, and an
``ssh`` on Horovod's PATH): it enters the worker's network namespace (and its CPU cgroup,
where ``contend --cpu`` capped it), names the host in ``DSSYNC_HOST``, and runs the
command in a shell. So Open MPI's daemons and Horovod's ranks run inside the workers, and
every byte between ranks crosses the emulated NICs and uplinks. MPI is held to TCP over
``eth0`` (``btl tcp,self``, ``pml ob1``): its shared-memory transport would pass between
the namespaces of one machine without touching the network.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .contention import cpu_cgroup
from .state import Cluster, EmulationError, load_state

__all__ = ["LAUNCHERS", "agent_main", "launcher_argv"]

LAUNCHERS = ("direct", "mpirun", "horovodrun")

# ssh options that take a value (the rest of ssh's single-letter options are flags)
_SSH_VALUE_OPTIONS = set("bcDEeFIiJLlmOopQRSWw")


def _tool(name: str) -> str:
    """``name`` on PATH, else beside this Python (a virtual environment's horovodrun)."""
    return shutil.which(name) or str(Path(sys.executable).with_name(name))


def _agent(name: str) -> list[str]:
    return [sys.executable, "-m", "dssync.launch.emulate.agent", "--name", name]


def launcher_argv(c: Cluster, launcher: str, command: Sequence[str], workdir: Path) -> list[str]:
    """The launcher's command line for ``command`` on every worker of ``c`` (one slot each,
    rank ``i`` on worker ``i``); ``workdir`` holds what the launcher needs on its PATH."""
    hosts = ",".join(f"{c.worker_addr(r)}:1" for r in range(c.world_size))
    n = str(c.world_size)
    if launcher == "mpirun":
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        mca = {"plm_rsh_agent": shlex.join(_agent(c.name)), "plm_rsh_no_tree_spawn": "1",
               "btl": "tcp,self", "pml": "ob1", "btl_tcp_if_include": "eth0", "oob_tcp_if_include": "eth0"}
        return [_tool("mpirun"), *root, "-np", n, "-H", hosts, *(a for k, v in mca.items() for a in ("--mca", k, v)),
                "-x", "GLOO_SOCKET_IFNAME", "-x", "PATH", *command]
    if launcher == "horovodrun":
        ssh = workdir / "ssh"  # Horovod starts remote ranks with the ssh on its PATH
        ssh.write_text(f"#!/bin/sh\nexec {shlex.join(_agent(c.name))} \"$@\"\n")
        ssh.chmod(0o755)
        return [_tool("horovodrun"), "-np", n, "-H", hosts, "--gloo", "--network-interfaces", "eth0", "--disable-cache",
                "--start-timeout", "120", *command]
    raise ValueError(f"unknown launcher {launcher!r}; choose one of: {', '.join(LAUNCHERS)}")


def launcher_env(launcher: str, workdir: Path) -> dict[str, str]:
    env = {"GLOO_SOCKET_IFNAME": "eth0", "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
    if launcher == "horovodrun":
        env["PATH"] = f"{workdir}:{os.environ.get('PATH', '')}"
    return env


def _worker_of(c: Cluster, host: str) -> int:
    for rank in range(c.world_size):
        if host in (c.worker_addr(rank), f"w{rank}"):
            return rank
    raise EmulationError(f"host {host!r} is no worker of emulated cluster {c.name!r} "
                         f"(workers are {c.worker_addr(0)}..{c.worker_addr(c.world_size - 1)})")


def _options_stripped(args: list[str]) -> list[str]:
    """``args`` without the ssh options in front (``-o KEY=VALUE``, ``-p PORT``, ``-x``, ...)."""
    rest = list(args)
    while rest and rest[0].startswith("-") and len(rest[0]) >= 2:
        option = rest.pop(0)
        if len(option) == 2 and option[1] in _SSH_VALUE_OPTIONS and rest:
            rest.pop(0)
    return rest


def agent_main(argv: Sequence[str]) -> int:
    """``agent --name NAME [ssh options] HOST COMMAND...``: run COMMAND in HOST's namespace."""
    args = list(argv)
    if len(args) < 2 or args[0] != "--name":
        raise SystemExit("usage: python -m dssync.launch.emulate.agent --name NAME [ssh options] HOST COMMAND...")
    c = load_state(args[1])
    rest = _options_stripped(args[2:])
    if len(rest) < 2:
        raise SystemExit(f"agent: no host and command in {list(argv)!r}")
    rank = _worker_of(c, rest[0])
    command = " ".join(_options_stripped(rest[1:]))  # ssh also takes options after the host
    argv_out = ["ip", "netns", "exec", c.worker_ns(rank), "env", f"DSSYNC_HOST=w{rank}", "sh", "-c", command]
    if rank in c.cpu_limit:  # join the worker's CPU cgroup first (outside the namespace's /sys)
        argv_out = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cpu_cgroup(c.name, rank)),
                    *argv_out]
    argv_out = ["setpriv", "--pdeathsig", "KILL", *argv_out]
    sys.stdout.flush()
    os.execvp(argv_out[0], argv_out)
    return 127  # not reached


def workdir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="dssync-launch-")
