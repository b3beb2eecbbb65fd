"""A sharded parameter server, co-located with the workers, over plain TCP.

The flat parameter vector is cut into ``world_size`` contiguous shards; rank ``s`` serves
shard ``s`` from a thread of its own process (one server and one worker per host, as in the
parameter-server deployments the ASP, SSP and Sync-Switch papers use). A worker talks to
every shard point to point:

- ``PUSHPULL(clock, gradient)``: the shard applies the gradient at once with its own SGD
  (the training loop's learning rate and momentum), sets the worker's clock to
  ``clock + 1`` and answers with the shard's parameters and version (the number of updates
  applied so far, the timestamp);
- ``PULL``: the parameters and version, nothing applied.

With ``staleness=None`` the answer goes out at once: asynchronous (ASP). With
``staleness=s`` the answer to a worker at clock ``c`` waits until every worker's clock is
at least ``c + 1 - s`` (stale-synchronous, SSP; ``s=0`` waits for everyone's push of
the same iteration). A wait longer than the timeout fails with the worker, shard and
lagging workers named.

Transport: one TCP connection per (worker, shard) pair, a fixed binary header and the raw
float32 bytes, written from and read into the tensors' own memory. It needs nothing from the
collective backend but an address exchange (``allgather_object``), so it runs beside gloo,
MPI or Horovod alike, and the control traffic of later protocols can use its own connections.
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import torch

from dssync.collectives import Communicator
from dssync.errors import CommunicationError
from dssync.ps.framing import (
    HEADER,
    Op,
    accept_each,
    connect,
    job_secret,
    local_address,
    recv_exact,
    recv_header,
    refuse,
    shard_bounds,
)

__all__ = ["ParameterServer"]


class _Shard:
    """One shard's parameters, optimizer state, version and the workers' clocks."""

    def __init__(self, params: np.ndarray, num_workers: int, *, lr: float, momentum: float,
                 staleness: int | None, timeout_s: float) -> None:
        self.params = params
        self.momentum_buf = np.zeros_like(params)
        self.lr, self.momentum = float(lr), float(momentum)
        self.version = 0
        self.clocks = [0] * num_workers
        self.staleness = staleness
        self.timeout_s = timeout_s
        self.lock = threading.RLock()  # what every reader and writer of the shard holds
        self.cond = threading.Condition(self.lock)

    def apply(self, worker: int, clock: int, grad: np.ndarray) -> None:
        with self.cond:
            if self.momentum:
                self.momentum_buf *= self.momentum
                self.momentum_buf += grad
                self.params -= self.lr * self.momentum_buf
            else:
                self.params -= self.lr * grad
            self.version += 1
            self.clocks[worker] = clock + 1
            self.cond.notify_all()

    def wait_fresh(self, worker: int, clock: int) -> str | None:
        """Block until SSP lets a worker at ``clock`` go on; an error text on timeout."""
        if self.staleness is None:
            return None
        need = clock + 1 - self.staleness
        with self.cond:
            if self.cond.wait_for(lambda: min(self.clocks) >= need, timeout=self.timeout_s):
                return None
            behind = [w for w, c in enumerate(self.clocks) if c < need]
            return (f"worker {worker} at clock {clock + 1} waited {self.timeout_s:.0f} s for workers "
                    f"{behind} (clocks {[self.clocks[w] for w in behind]}) to reach {need} "
                    f"(staleness bound {self.staleness})")


class ParameterServer:
    """This rank's shard server and its client connections to every shard (collective setup).

    ``flat`` is the worker's float32 parameter buffer: pulls write into it in place, so a
    model whose parameters are views of it (``dssync.averaging.flat``) sees the server's values.
    """

    def __init__(self, comm: Communicator, flat: torch.Tensor, *, lr: float, momentum: float = 0.0,
                 staleness: int | None = None, timeout_s: float | None = None) -> None:
        if flat.dtype != torch.float32 or flat.device.type != "cpu" or not flat.is_contiguous():
            raise ValueError("the parameter server holds one contiguous float32 CPU buffer; "
                             f"got {flat.dtype} on {flat.device}")
        if staleness is not None and staleness < 0:
            raise ValueError(f"staleness must be 0 or more (None: asynchronous), got {staleness}")
        self.comm, self.flat = comm, flat
        self.rank, self.n = comm.rank, comm.world_size
        self.timeout_s = comm.timeout_s if timeout_s is None else timeout_s
        # A client waits twice as long as a shard may hold an SSP answer back, so that the
        # shard's own report (which workers it waited for) arrives before the client gives up.
        self._client_timeout_s = 2 * self.timeout_s
        self.bounds = shard_bounds(flat.numel(), self.n)
        start, stop = self.bounds[self.rank]
        # The optimizer settings are fixed before the shard serves: a peer may push as soon
        # as the addresses are exchanged.
        self._shard = self._new_shard(flat[start:stop].numpy().copy(), lr=lr, momentum=momentum,
                                      staleness=staleness)
        self._secret = job_secret(comm)
        self._listener = socket.create_server((local_address(), 0), backlog=self.n)
        self._listener.settimeout(self.timeout_s)
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, name=f"ps-accept-{self.rank}", daemon=True)
        accept.start()
        self._threads.append(accept)
        addrs = comm.allgather_object(self._listener.getsockname()[:2])
        self._socks = [self._connect(s, tuple(a)) for s, a in enumerate(addrs)]
        self.versions = [0] * self.n

    # -- server side ------------------------------------------------------------------------
    def _new_shard(self, params: np.ndarray, *, lr: float, momentum: float, staleness: int | None) -> _Shard:
        return _Shard(params, self.n, lr=lr, momentum=momentum, staleness=staleness, timeout_s=self.timeout_s)

    def _accept(self) -> None:
        accept_each(self._listener, self.n, self._serve, f"rank {self.rank}'s parameter-server shard", self._threads,
                    secret=self._secret)

    def _serve(self, conn: socket.socket) -> None:
        shard = self._shard
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
    def _connect(self, shard: int, addr: tuple[str, int]) -> socket.socket:
        return connect(addr, self._client_timeout_s,
                       f"rank {self.rank}: cannot reach the parameter-server shard of rank {shard}",
                       secret=self._secret, worker=self.rank)

    def _views(self, tensor: torch.Tensor) -> list[memoryview]:
        arr = tensor.numpy()
        return [memoryview(arr[a:b]).cast("B") for a, b in self.bounds]

    def _exchange(self, op: int, clock: int, grad: torch.Tensor | None) -> None:
        what = "push and pull" if op == Op.PUSHPULL else "pull"
        sent = self._views(grad) if grad is not None else [memoryview(b"")] * self.n
        into = self._views(self.flat)
        shard = -1
        started = time.monotonic()
        try:
            for shard, (sock, payload) in enumerate(zip(self._socks, sent, strict=True)):  # noqa: B007
                sock.sendall(HEADER.pack(op, self.rank, clock, 0, payload.nbytes))
                if payload.nbytes:
                    sock.sendall(payload)
            for shard, (sock, view) in enumerate(zip(self._socks, into, strict=True)):
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
                                     f"(the limit is {self._client_timeout_s:.0f} s): "
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

    # -- the protocol every server speaks, whatever its shard rule ------------------------------
    #: Seconds this worker's last push took alone, before any wait for other workers, where the
    #: server tells the two apart (rounds); ``None`` where a push waits for nobody.
    last_send_s: float | None = None

    def set_idle(self, idle: bool) -> None:
        """Leave the rounds for a while (``True``) or come back; a server without rounds has
        nothing to leave."""
        return None

    def momentum(self) -> np.ndarray:
        """A copy of this rank's shard's momentum buffer (what a successor server takes over)."""
        with self._shard.lock:
            return self._shard.momentum_buf.copy()

    def set_momentum(self, buffer: np.ndarray) -> None:
        """Take over a predecessor's momentum for this rank's shard (before any push reaches it)."""
        with self._shard.lock:
            self._shard.momentum_buf[:] = buffer

    def stats(self) -> dict[str, object]:
        """What this rank's shard counted (rounds servers report theirs)."""
        return {}

    def close(self) -> None:
        """Tell every shard this worker is done, then wait (bounded) until this rank's shard
        has heard the same from every worker, so that no server thread is still inside a
        receive or an update when the process tears down its libraries."""
        for sock in self._socks:
            try:
                sock.sendall(HEADER.pack(Op.STOP, self.rank, 0, 0, 0))
                sock.close()
            except OSError:
                pass
        deadline = time.monotonic() + min(self.timeout_s, 60.0)
        for t in list(self._threads):
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        try:
            self._listener.close()
        except OSError:
            pass
