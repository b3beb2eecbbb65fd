"""Network topology: the ``Topology`` model and its JSON contract."""

from dssync.topology.model import TOPOLOGY_VERSION, Topology, Worker

__all__ = ["TOPOLOGY_VERSION", "Topology", "Worker"]
