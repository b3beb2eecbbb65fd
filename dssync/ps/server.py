"""A sharded parameter server, co-located with the workers, over plain TCP.

The flat parameter vector is cut into ``world_size`` contiguous shards; rank ``s`` serves
shard ``s`` from a thread of its own process (one server and one worker per host, as in the
parameter-server deployments the ASP, SSP and Sync-Switch papers use). A worker talks to
every shard point to point:

- ``PUSHPULL(clock, gradient)``: the shard applies the gradient at once with its own SGD
  (``torch.optim.SGD`` with the training loop's settings), sets the worker's clock to
  ``clock + 1`` and answers with the shard's parameters and version (the number of updates
  applied so far, the timestamp);
- ``PULL``: the parameters and version, nothing applied.

With ``staleness=None`` the answer goes out at once: asynchronous (ASP). With
``staleness=s`` the answer to a worker at clock ``c`` waits until every worker's clock is
at least ``c + 1 - s`` (stale-synchronous, SSP; ``s=0`` waits for everyone's push of
the same iteration). A wait longer than the timeout fails with the worker, shard and
lagging workers named.

The server is a composition: the transport (``dssync.ps.links.ShardLinks``: one TCP
connection per (worker, shard) pair, a fixed binary header and the raw float32 bytes, written
from and read into the tensors' own memory), the shard rule (``dssync.ps.shards.ImmediateShard``)
and the request-and-reply protocol here. It needs nothing from the collective backend but an
address exchange (``allgather_object``), so it runs beside gloo, MPI or Horovod alike.
``PartialServer`` (``dssync.ps.partial``) composes the same transport with rounds; both speak
``ShardServer``, the protocol the strategies use.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Protocol

import numpy as np
import torch

from dssync.collectives import Communicator
from dssync.errors import CommunicationError
from dssync.ps.framing import HEADER, Op, recv_exact, recv_header, refuse, shard_bounds
from dssync.ps.links import ShardLinks
from dssync.ps.shards import ImmediateShard

__all__ = ["ParameterServer", "ShardServer", "check_flat"]


class ShardServer(Protocol):
    """What a worker's strategy asks of a parameter server, whatever its shard rule."""

    versions: list[int]
    """Per shard, the version of the parameters last read from it."""
    last_send_s: float | None
    """Seconds this worker's last push took alone, before any wait for other workers, where the
    server tells the two apart (rounds); ``None`` where a push waits for nobody."""

    def push_pull(self, grad: torch.Tensor, clock: int) -> None:
        """Push this worker's gradient of iteration ``clock`` to every shard and pull the result."""

    def pull(self) -> None:
        """Overwrite the parameter buffer with every shard's current parameters."""

    def pull_settled(self, stay_idle: bool = False) -> None:
        """Collective: pull once every push of every worker has been applied."""

    def set_idle(self, idle: bool) -> None:
        """Leave the rounds for a while (``True``) or come back."""

    def momentum(self) -> np.ndarray:
        """A copy of this rank's shard's momentum buffer (what a successor server takes over)."""

    def set_momentum(self, buffer: np.ndarray) -> None:
        """Take over a predecessor's momentum for this rank's shard (before any push reaches it)."""

    def stats(self) -> dict[str, object]:
        """What this rank's shard counted."""

    def close(self) -> None:
        """Tell every shard this worker is done; wait (bounded) until this rank's shard is."""


def check_flat(flat: torch.Tensor) -> None:
    """A parameter server holds one contiguous float32 CPU buffer."""
    if flat.dtype != torch.float32 or flat.device.type != "cpu" or not flat.is_contiguous():
        raise ValueError("the parameter server holds one contiguous float32 CPU buffer; "
                         f"got {flat.dtype} on {flat.device}")


class ParameterServer:
    """This rank's shard server and its client connections to every shard (collective setup).

    ``flat`` is the worker's float32 parameter buffer: pulls write into it in place, so a
    model whose parameters are views of it (``dssync.averaging.flat``) sees the server's values.
    ``lr`` and ``sgd`` are ``torch.optim.SGD``'s settings for the shards (``momentum``,
    ``dampening``, ``nesterov``, ``maximize``).
    """

    last_send_s: float | None = None

    def __init__(self, comm: Communicator, flat: torch.Tensor, *, lr: float, staleness: int | None = None,
                 timeout_s: float | None = None, **sgd: Any) -> None:
        check_flat(flat)
        if staleness is not None and staleness < 0:
            raise ValueError(f"staleness must be 0 or more (None: asynchronous), got {staleness}")
        self.comm, self.flat = comm, flat
        self.rank, self.n = comm.rank, comm.world_size
        timeout_s = comm.timeout_s if timeout_s is None else timeout_s
        self.timeout_s = timeout_s
        # The shard (and its optimizer settings) exists before it serves: a peer may push as
        # soon as the addresses are exchanged.
        start, stop = shard_bounds(flat.numel(), self.n)[self.rank]
        self.shard = ImmediateShard(flat[start:stop].numpy().copy(), self.n, sgd=dict(sgd, lr=lr),
                                    staleness=staleness, timeout_s=timeout_s)
        self.links = ShardLinks(comm, flat.numel(), self._serve, f"rank {self.rank}'s parameter-server shard",
                                timeout_s)
        self.bounds = self.links.bounds
        self.versions = [0] * self.n

    # -- server side ------------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        shard = self.shard
        grad = np.empty_like(shard.params)
        out = np.empty_like(shard.params)
        with conn:
            while True:
                try:
                    op, worker, clock, _, nbytes = recv_header(conn)
                except (ConnectionError, OSError):
                    return
                if op == Op.STOP:
                    return
                if op not in (Op.PUSHPULL, Op.PULL) or worker >= self.n or (op == Op.PULL and nbytes):
                    refuse(conn, f"rank {self.rank}'s parameter-server shard",
                           f"a malformed frame (operation {op}, worker {worker}, {nbytes} bytes)")
                    return
                if op == Op.PUSHPULL:
                    if nbytes != grad.nbytes:
                        return  # a peer with another model: drop it; its client times out, named
                    recv_exact(conn, memoryview(grad).cast("B"))
                    shard.apply(worker, clock, grad)
                    failure = shard.wait_fresh(worker, clock)
                    if failure is not None:
                        text = failure.encode()
                        conn.sendall(HEADER.pack(Op.FAIL, self.rank, clock, 0, len(text)) + text)
                        return
                with shard.cond:
                    out[:] = shard.params
                    version = shard.version
                conn.sendall(HEADER.pack(Op.REPLY, self.rank, clock, version, out.nbytes))
                conn.sendall(memoryview(out).cast("B"))

    # -- client side ------------------------------------------------------------------------
    def _exchange(self, op: int, clock: int, grad: torch.Tensor | None) -> None:
        what = "push and pull" if op == Op.PUSHPULL else "pull"
        socks = self.links.socks
        sent = self.links.views(grad) if grad is not None else [memoryview(b"")] * self.n
        into = self.links.views(self.flat)
        shard = -1
        started = time.monotonic()
        try:
            for shard in self.links.push_order:
                sock, payload = socks[shard], sent[shard]
                sock.sendall(HEADER.pack(op, self.rank, clock, 0, payload.nbytes))
                if payload.nbytes:
                    sock.sendall(payload)
            for shard, (sock, view) in enumerate(zip(socks, into, strict=True)):
                kind, _, _, version, nbytes = recv_header(sock)
                if kind == Op.FAIL:
                    text = bytearray(nbytes)
                    recv_exact(sock, memoryview(text))
                    raise CommunicationError(f"rank {self.rank}: {what} at clock {clock} on the shard of rank "
                                             f"{shard}: {text.decode()}")
                if kind != Op.REPLY or nbytes != view.nbytes:
                    raise CommunicationError(f"rank {self.rank}: the shard of rank {shard} answered "
                                             f"{nbytes} bytes, expected {view.nbytes}; do all ranks train "
                                             "the same model?")
                recv_exact(sock, view)
                self.versions[shard] = version
        except (TimeoutError, ConnectionError, OSError) as exc:
            raise CommunicationError(f"rank {self.rank}: {what} at clock {clock} with the parameter-server "
                                     f"shard of rank {shard} failed after {time.monotonic() - started:.1f} s "
                                     f"(the limit is {self.links.client_timeout_s:.0f} s): "
                                     f"{exc or type(exc).__name__}") from None

    def push_pull(self, grad: torch.Tensor, clock: int) -> None:
        """Push this worker's gradient of iteration ``clock`` to every shard and pull the result."""
        if grad.shape != self.flat.shape or grad.dtype != torch.float32:
            raise ValueError(f"gradient must match the parameter buffer ({self.flat.numel()} float32)")
        self._exchange(Op.PUSHPULL, clock, grad.contiguous())

    def pull(self) -> None:
        """Overwrite the parameter buffer with every shard's current parameters."""
        self._exchange(Op.PULL, -1, None)

    def pull_settled(self, stay_idle: bool = False) -> None:
        """Collective: once every worker has stopped pushing (a barrier), pull, so every
        push of every worker is in what this worker reads. (``stay_idle`` matters only to
        servers whose workers take part in rounds.)"""
        self.comm.barrier()
        self.pull()

    def set_idle(self, idle: bool) -> None:
        """A server without rounds has nothing to leave."""
        return None

    def momentum(self) -> np.ndarray:
        return self.shard.sgd.momentum()

    def set_momentum(self, buffer: np.ndarray) -> None:
        self.shard.sgd.set_momentum(buffer)

    def stats(self) -> dict[str, object]:
        return self.shard.stats()

    def close(self) -> None:
        self.links.close()
