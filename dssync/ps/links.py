"""One rank's connections in a sharded parameter server: its shard's listener, which admits the
job's workers only (``dssync.ps.framing.accept_each``) and serves each from a thread of its
own, and this worker's client connection to every shard. Both servers (``ParameterServer``,
``PartialServer``) own one; what they say over it is theirs."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import torch

from dssync.collectives import Communicator
from dssync.ps.framing import (
    HEADER,
    Op,
    accept_each,
    connect,
    job_secret,
    local_address,
    shard_bounds,
)

__all__ = ["ShardLinks", "push_order"]


def push_order(rank: int, world_size: int) -> list[int]:
    """The shards in the order worker ``rank`` sends to them: from the next rank's on, its
    own last. Workers that push at the same moment (a synchronous round, every worker at
    once) then send to different shards at every moment, each NIC taking one push, instead
    of all into shard 0's NIC first, then all into shard 1's: measured on the emulated
    cluster, sync-switch's BSP rounds took 1.6-1.9 times its ASP iterations with one order
    for all (docs/simulator.md)."""
    return [(rank + 1 + k) % world_size for k in range(world_size)]


class ShardLinks:
    """This rank's shard listener and its client connections to every shard (collective set-up).

    ``serve`` is called with each admitted worker's connection, from a daemon thread; ``bounds``
    cut a ``numel`` vector into one shard per rank. A client waits ``client_timeout_s`` for a
    shard, twice the server's ``timeout_s``, so that a shard's own report of what it waited for
    arrives before the client gives up."""

    def __init__(self, comm: Communicator, numel: int, serve: Callable[[socket.socket], None], name: str,
                 timeout_s: float) -> None:
        self.rank, self.n = comm.rank, comm.world_size
        self.timeout_s = timeout_s
        self.client_timeout_s = 2 * timeout_s
        self.bounds = shard_bounds(numel, self.n)
        self.push_order = push_order(self.rank, self.n)  # the shards in the order this worker sends to them
        self.name = name
        self._secret = job_secret(comm)
        self._listener = socket.create_server((local_address(), 0), backlog=self.n)
        self._listener.settimeout(timeout_s)
        self.threads: list[threading.Thread] = []
        accept = threading.Thread(target=accept_each, args=(self._listener, self.n, serve, name, self.threads),
                                  kwargs={"secret": self._secret}, name=f"ps-accept-{self.rank}", daemon=True)
        accept.start()
        self.threads.append(accept)
        addrs = comm.allgather_object(self._listener.getsockname()[:2])
        self.socks = [connect(tuple(a), self.client_timeout_s,
                              f"rank {self.rank}: cannot reach the parameter-server shard of rank {s}",
                              secret=self._secret, worker=self.rank)
                      for s, a in enumerate(addrs)]


    def views(self, tensor: torch.Tensor) -> list[memoryview]:
        """Byte views of each shard's slice of ``tensor`` (a contiguous float32 CPU vector)."""
        arr = tensor.numpy()
        return [memoryview(arr[a:b]).cast("B") for a, b in self.bounds]

    def close(self) -> None:
        """Tell every shard this worker is done, then wait (bounded) until this rank's shard
        has heard the same from every worker, so that no server thread is still inside a
        receive or an update when the process tears down its libraries."""
        for sock in self.socks:
            try:
                sock.sendall(HEADER.pack(Op.STOP, self.rank, 0, 0, 0))
                sock.close()
            except OSError:
                pass
        deadline = time.monotonic() + min(self.timeout_s, 60.0)
        for t in list(self.threads):
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        try:
            self._listener.close()
        except OSError:
            pass
