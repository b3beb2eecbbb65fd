"""Collective wrappers: the ``Communicator`` interface and its adapters."""

from dssync.collectives.base import Communicator, Group, Work
from dssync.collectives.fake import FakeCommunicator, FakeWorld
from dssync.collectives.torch_dist import TorchCommunicator, default_backend, init_process_group

__all__ = [
    "Communicator",
    "FakeCommunicator",
    "FakeWorld",
    "Group",
    "TorchCommunicator",
    "Work",
    "default_backend",
    "init_process_group",
]
