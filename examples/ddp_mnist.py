"""PyTorch's DDP training script for MNIST, with DS-Sync in two lines (marked ``# dssync``).

    torchrun --standalone --nproc_per_node 4 examples/ddp_mnist.py

Everything else is the script people already run: ``DistributedSampler`` and ``DataLoader``,
``DistributedDataParallel``, SGD with momentum, ``sampler.set_epoch`` every epoch. The first
line stops DDP's global gradient allreduce (each rank steps on its own gradients); the second
wraps the optimizer in torch's ``PostLocalSGDOptimizer`` with DS-Sync's model averager, which
averages the parameters with this iteration's group after every step. The planned groups come
from ``dssync probe`` when the ranks span several hosts, else from two logical racks; pass
``DSSyncAverager("topology.json")`` to use a measured topology.

It computes what ``dssync train --strategy ds-sync --task mnist --nproc 4`` computes on the
same seed, parameter for parameter on every rank (tests/launchers/test_ddp_example.py).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from dssync import DSSyncAverager, LocalSGDState, local_sgd_hook
from dssync.training.tasks import build_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", default="mnist", help="a dssync task: its data and model (MNIST: 784-256-10)")
    parser.add_argument("--save", metavar="DIR", help="write each rank's parameters to DIR/rank{r}.pt")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun's environment says where rank 0 is
    rank = dist.get_rank()
    task = build_task(args.task, seed=args.seed)  # the training and test tensors, and the model
    dataset = TensorDataset(task.train_x, task.train_y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = DistributedDataParallel(task.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model.register_comm_hook(LocalSGDState(), local_sgd_hook)  # dssync
    optimizer = PostLocalSGDOptimizer(optimizer, DSSyncAverager())  # dssync

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step == args.steps:
                break
        epoch += 1

    final = optimizer.averager.final_model(model)  # the world average of the ranks' models
    if rank == 0:
        accuracy, test_loss = task.evaluate(final)
        print(f"{args.steps} steps on {dist.get_world_size()} ranks: test accuracy {accuracy:.4f}, loss {test_loss:.4f}")
    if args.save:
        torch.save(model.module.state_dict(), f"{args.save}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
