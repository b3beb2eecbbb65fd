"""Network topology: the ``Topology`` model and its JSON contract, and racks and contention inferred from measured matrices (pure numpy)."""

from dssync.topology.model import TOPOLOGY_VERSION, Topology, Worker

__all__ = ["TOPOLOGY_VERSION", "Topology", "Worker"]
