"""DS-Sync in your own training loop, one process per rank under a launcher:

    torchrun --standalone --nproc_per_node 4 examples/custom_loop.py
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dssync.collectives import TorchCommunicator
from dssync.strategies import DSSyncStrategy
from dssync.strategies.base import StrategyContext
from dssync.topology import Topology
from dssync.training.tasks import build_task


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun's environment says where rank 0 is
    comm = TorchCommunicator(timeout_s=120)
    task = build_task("digits", seed=0)  # any model and data of yours
    model = task.model
    topology = Topology.even(comm.world_size, 2)  # or Topology.load("topology.json")
    strategy = DSSyncStrategy(StrategyContext(comm=comm, model=model, topology=topology))
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    strategy.setup()  # same groups on every rank, common initial parameters
    batches = task.batches(comm.rank, comm.world_size, batch_size=32, seed=0)
    for step in range(200):
        x, y = next(batches)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)  # parameter averaging within this step's group
    final = strategy.final_model()  # the world average of every rank's model
    if comm.rank == 0:
        print(f"test accuracy {task.accuracy(final):.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
