"""dssync: divide-and-shuffle synchronization for data-parallel PyTorch training.

The core objects::

    from dssync.topology import Topology
    from dssync.planning.planner import static_plan
    topology = Topology.from_rack_sizes([4, 4])
    schedule = static_plan(topology)        # who averages with whom, iteration by iteration
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
