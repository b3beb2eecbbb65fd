"""Launching: detect a launcher's environment, spawn local ranks, build Horovod, and the emulated cluster (``emulate``)."""

from dssync.launch.env import LaunchEnv, from_environ
from dssync.launch.spawn import free_port, run_ranks

__all__ = ["LaunchEnv", "free_port", "from_environ", "run_ranks"]
