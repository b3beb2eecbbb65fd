"""Partial synchronization on the sharded parameter server (PSP-SGD, the weak/partial synchronization paper).

``PartialServer`` composes the transport every server uses (``dssync.ps.links``: one shard
per rank, one TCP connection per worker and shard) with the round rule
(``dssync.ps.shards.RoundShard``) and the protocol of the paper's Algorithm 1 in place of
request-and-reply:

- **Server (shard) rounds.** Shard ``s`` is at round ``r`` with parameters of version
  ``r``. A worker's push carries the version of the block it computed its gradient on. A
  push on version ``r`` joins the round; a push on an older version is *stale* and dropped
  (the paper drops; folding it into a later round is left out). Once ``push_quorum``
  (``c``) pushes have joined, the shard waits ``tau1`` seconds more for the rest (0 in the
  paper's experiments), or until every worker has pushed, then applies the ``d`` gradients
  it holds and starts round ``r + 1`` by sending the new block, with its version, to *every*
  worker (the server-initiated broadcast of the paper; no pull request).
- **Worker pulls.** After pushing, a worker waits until ``ceil(pull_fraction * shards)``
  shards have sent a block newer than the one it pushed on, waits ``tau2`` seconds more
  for the rest, then copies in every block that has arrived; a block that has not keeps
  its value from the last iteration. Blocks arrive on a receiver thread per shard into a
  staging buffer, so a late block is taken up at the next pull.

Choices the weak/partial synchronization paper leaves open, made here:

1. **Learning rate by d** (its line 13 is unreadable): the linear scaling rule on the mean,
   ``lr * (d / k) * (sum of the d gradients / d) = lr * sum / k``, where ``lr`` is the rate
   that a full round (``d = k``, the loop's batch times ``k``) would use. With ``c = k`` and
   ``pull_fraction = 1`` the protocol is synchronous SGD on the servers, step for step the
   ``allreduce`` baseline. The step is ``torch.optim.SGD``'s with the loop's settings
   (momentum, dampening, Nesterov; weight decay is a term of the worker's gradient), one step
   per round.
2. **Blocks**: one contiguous, equal-size block per shard (``shard_bounds``); ``b`` is
   rounded up to whole shards, ``c`` is a count of workers.
3. **Timeouts**: ``tau1`` starts at the ``c``-th push that joined the round; ``tau2`` at the
   ``ceil(b * S)``-th fresh block. "Every worker responded" counts stale pushes too: a
   round with at least one joined push closes once every active worker has pushed since
   it opened. Counting joined pushes only stalls: workers whose blocks of some shards are
   stale (``b < 1``) push stale gradients there, those shards wait for fresh ones from
   workers that wait for their blocks, and with 8 workers, ``c = 5``, ``b = 0.75`` and 10 %
   of blocks delayed by 1 s, two runs of three stopped until their timeout. With the
   stale pushes counted, the worker that pushed earliest among any that wait has pushed
   to every round they wait on, so some round always closes.
4. **Timestamps**: a shard's version is its round; workers never run ahead of the
   versions they hold, so "a push from the future" cannot occur and nothing else bounds
   drift (a worker with stale blocks keeps pushing stale gradients there until a block
   arrives).
5. **First iteration**: every worker starts from rank 0's parameters (version 0 on every
   shard), after ``Strategy.setup``'s broadcast.
6. **Delays**: ``delay_prob`` / ``delay_s`` delay a shard's block message to one worker by
   ``delay_s`` seconds with that probability (the paper's 0.16 % of pull responses by 4 s,
   an application-level model; scale the probability to keep about 1.64 delayed messages
   per iteration, ``1.64 / (workers * shards)``). The delay holds up that connection's
   later blocks too, as a delayed message would on one TCP stream.
"""

from __future__ import annotations

import math
import queue
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dssync.collectives import Communicator
from dssync.errors import CommunicationError
from dssync.ps.framing import HEADER, Op, recv_exact, recv_header, refuse, shard_bounds
from dssync.ps.links import ShardLinks
from dssync.ps.server import check_flat
from dssync.ps.shards import RoundShard

__all__ = ["PartialServer"]


class PartialServer:
    """A sharded parameter server with partial pushing and pulling (see the module docstring);
    it speaks ``dssync.ps.server.ShardServer``.

    ``push_quorum`` (c) is the number of workers whose pushes close a round, at most the
    world size; ``pull_fraction`` (b) the fraction of shards a worker waits for. Collective
    set-up, like ``ParameterServer``.
    """

    last_send_s: float | None = None

    def __init__(self, comm: Communicator, flat: torch.Tensor, *, lr: float, push_quorum: int | None = None,
                 pull_fraction: float = 1.0, tau1_s: float = 0.0, tau2_s: float = 0.0, delay_prob: float = 0.0,
                 delay_s: float = 0.0, seed: int = 0, timeout_s: float | None = None, **sgd: Any) -> None:
        check_flat(flat)
        n = comm.world_size
        quorum = n if push_quorum is None else int(push_quorum)
        if not 1 <= quorum <= n:
            raise ValueError(f"push_quorum must be 1..{n} (the number of workers), got {push_quorum}")
        if not 0.0 < pull_fraction <= 1.0:
            raise ValueError(f"pull_fraction must be in (0, 1], got {pull_fraction}")
        if tau1_s < 0 or tau2_s < 0 or delay_s < 0 or not 0.0 <= delay_prob <= 1.0:
            raise ValueError("tau1_s, tau2_s and delay_s must be 0 or more, delay_prob in [0, 1]")
        self.quorum, self.pull_fraction, self.tau1_s, self.tau2_s = quorum, pull_fraction, tau1_s, tau2_s
        self.delay_prob, self.delay_s = delay_prob, delay_s
        self._rng = random.Random(seed * 7919 + comm.rank)
        self._outboxes: list[queue.Queue] = []
        self._outbox_lock = threading.Lock()
        self.comm, self.flat = comm, flat
        self.rank, self.n = comm.rank, n
        self.timeout_s = comm.timeout_s if timeout_s is None else timeout_s
        start, stop = shard_bounds(flat.numel(), n)[self.rank]
        self.shard = RoundShard(flat[start:stop].numpy().copy(), n, sgd=dict(sgd, lr=lr), quorum=quorum,
                                tau1_s=tau1_s, on_round=self._broadcast)
        self.links = ShardLinks(comm, flat.numel(), self._serve, f"rank {self.rank}'s parameter-server shard",
                                self.timeout_s)
        self.bounds = self.links.bounds
        self.versions = [0] * n
        # Client side: a receiver per shard stages the newest block; push_pull copies them in.
        self._staged = [np.zeros(b - a, dtype=np.float32) for a, b in self.bounds]
        self._staged_version = [0] * self.n
        self._pull_replies = [0] * self.n
        self._fresh = threading.Condition()
        self._failure: str | None = None
        self._closing = False
        self._receivers = [threading.Thread(target=self._receive, args=(s,), name=f"psp-recv-{self.rank}-{s}",
                                            daemon=True) for s in range(self.n)]
        for t in self._receivers:
            t.start()
        self.delayed = 0
        # A round's block goes to the workers whose connections this shard has taken: wait
        # for all of them, so none misses the first rounds.
        deadline = time.monotonic() + self.timeout_s
        while True:
            with self._outbox_lock:
                if len(self._outboxes) == self.n:
                    break
            if time.monotonic() > deadline:
                raise CommunicationError(f"rank {self.rank}: the parameter-server shard took "
                                         f"{len(self._outboxes)} of {self.n} workers' connections in "
                                         f"{self.timeout_s:.0f} s")
            time.sleep(0.01)
        comm.barrier()

    # -- server side ------------------------------------------------------------------------
    def _broadcast(self, block: np.ndarray, version: int) -> None:
        with self._outbox_lock:
            for box in self._outboxes:
                box.put((block, version, Op.REPLY))

    def _serve(self, conn: socket.socket) -> None:
        shard = self.shard
        outbox: queue.Queue = queue.Queue()
        stopping = threading.Event()
        with self._outbox_lock:
            self._outboxes.append(outbox)
        sender = threading.Thread(target=self._send, args=(conn, outbox, stopping), name=f"psp-send-{self.rank}",
                                  daemon=True)
        sender.start()
        grad = np.empty_like(shard.params)
        try:
            while True:
                try:
                    op, worker, version, _, nbytes = recv_header(conn)
                except (ConnectionError, OSError):
                    return
                if worker >= self.n or op not in (Op.STOP, Op.IDLE, Op.ACTIVE, Op.PULL, Op.PUSHPULL):
                    refuse(conn, f"rank {self.rank}'s partial-sync shard",
                           f"a malformed frame (operation {op}, worker {worker})")
                    return
                if op in (Op.STOP, Op.IDLE, Op.ACTIVE):
                    shard.set_active(worker, op == Op.ACTIVE)
                    if op == Op.STOP:
                        return
                    continue
                if op == Op.PULL:
                    with shard.lock:
                        outbox.put((shard.params.copy(), shard.version, Op.PULL))
                    continue
                if op != Op.PUSHPULL or nbytes != grad.nbytes:
                    return  # a peer with another model: drop it; its client times out, named
                recv_exact(conn, memoryview(grad).cast("B"))
                shard.push(worker, version, grad)
        finally:
            with self._outbox_lock:
                self._outboxes.remove(outbox)
            stopping.set()  # the worker is gone: a delay in progress ends, nothing more is sent
            outbox.put(None)
            sender.join(timeout=self.timeout_s)

    def _send(self, conn: socket.socket, outbox: queue.Queue, stopping: threading.Event) -> None:
        """Send this connection's blocks in order; a delayed one holds up the ones behind it."""
        while (item := outbox.get()) is not None:
            block, version, kind = item
            if kind == Op.REPLY and self.delay_prob and self._rng.random() < self.delay_prob:
                with self._outbox_lock:
                    self.delayed += 1
                if stopping.wait(self.delay_s):
                    return
            try:
                conn.sendall(HEADER.pack(kind, self.rank, version, version, block.nbytes))
                conn.sendall(memoryview(block).cast("B"))
            except OSError:
                return

    # -- client side ------------------------------------------------------------------------
    def _receive(self, shard: int) -> None:
        sock = self.links.socks[shard]
        incoming = np.empty_like(self._staged[shard])
        while True:
            try:
                kind, _, _, version, nbytes = recv_header(sock)
                if kind not in (Op.REPLY, Op.PULL) or nbytes != incoming.nbytes:
                    raise CommunicationError(f"the shard of rank {shard} sent {nbytes} bytes, expected "
                                             f"{incoming.nbytes}; do all ranks train the same model?")
                recv_exact(sock, memoryview(incoming).cast("B"))
            except (OSError, ConnectionError, CommunicationError) as exc:
                with self._fresh:
                    if self._failure is None and not self._closing:
                        self._failure = f"shard of rank {shard}: {exc or type(exc).__name__}"
                    self._fresh.notify_all()
                return
            with self._fresh:
                if version >= self._staged_version[shard]:
                    self._staged[shard], incoming = incoming, self._staged[shard]
                    self._staged_version[shard] = version
                if kind == Op.PULL:
                    self._pull_replies[shard] += 1
                self._fresh.notify_all()

    def _wait_fresh(self, pushed: list[int], need: int, what: str) -> None:
        """Wait until ``need`` shards staged a block newer than ``pushed``, then ``tau2`` for
        the rest; copy every newer staged block into the parameters."""
        def fresh() -> int:
            return sum(v > p for v, p in zip(self._staged_version, pushed, strict=True))

        with self._fresh:
            self._wait(lambda: fresh() >= need, what, lambda: [s for s in range(self.n)
                                                              if self._staged_version[s] <= pushed[s]],
                       f"{need} of {self.n} shards to send a block newer than the one pushed on")
            if self.tau2_s > 0 and fresh() < self.n:
                self._fresh.wait_for(lambda: fresh() == self.n or self._failure is not None, timeout=self.tau2_s)
            self._take_staged()

    def _wait(self, ready: Callable[[], bool], what: str, late: Callable[[], list[int]], waited_for: str) -> None:
        """Wait (``_fresh`` held) until ``ready()``; a receiver's failure or the timeout raises,
        naming this rank and the shards still ``late()``."""
        if not self._fresh.wait_for(lambda: ready() or self._failure is not None, timeout=self.links.client_timeout_s):
            raise CommunicationError(f"rank {self.rank}: {what}: waited {self.links.client_timeout_s:.0f} s for "
                                     f"{waited_for}; shards {late()} sent none")
        if self._failure is not None:
            raise CommunicationError(f"rank {self.rank}: {what}: {self._failure}")

    def _take_staged(self) -> None:
        """Copy every staged block newer than the parameters' into them (``_fresh`` held)."""
        into = self.flat.numpy()
        for s, (a, b) in enumerate(self.bounds):
            if self._staged_version[s] >= self.versions[s]:
                into[a:b] = self._staged[s]
                self.versions[s] = self._staged_version[s]

    def push_pull(self, grad: torch.Tensor, clock: int) -> None:
        """Push the gradient to every shard (each tagged with the version of the block it was
        computed on), then take the blocks of the first ``ceil(pull_fraction * shards)``."""
        if grad.shape != self.flat.shape or grad.dtype != torch.float32:
            raise ValueError(f"gradient must match the parameter buffer ({self.flat.numel()} float32)")
        pushed = list(self.versions)
        views = self.links.views(grad.contiguous())
        shard = -1
        t0 = time.perf_counter()
        try:
            for shard in self.links.push_order:
                payload = views[shard]
                self.links.socks[shard].sendall(HEADER.pack(Op.PUSHPULL, self.rank, pushed[shard], 0, payload.nbytes)
                                                + payload)
        except OSError as exc:
            raise CommunicationError(f"rank {self.rank}: push at iteration {clock} to the shard of rank {shard} "
                                     f"failed: {exc or type(exc).__name__}") from None
        self.last_send_s = time.perf_counter() - t0  # the push alone, before any wait for the round
        self._wait_fresh(pushed, math.ceil(self.pull_fraction * self.n - 1e-9), f"pull at iteration {clock}")

    def pull(self) -> None:
        """Every shard's current block: ask each shard and wait for all the answers."""
        with self._fresh:
            before = list(self._pull_replies)
        try:
            for sock in self.links.socks:
                sock.sendall(HEADER.pack(Op.PULL, self.rank, -1, 0, 0))
        except OSError as exc:
            raise CommunicationError(f"rank {self.rank}: pull: {exc or type(exc).__name__}") from None
        with self._fresh:
            answered = lambda: [s for s in range(self.n) if self._pull_replies[s] > before[s]]  # noqa: E731
            self._wait(lambda: len(answered()) == self.n, "pull",
                       lambda: sorted(set(range(self.n)) - set(answered())), "every shard's current block")
            self._take_staged()

    def set_idle(self, idle: bool) -> None:
        """Tell every shard this worker leaves the rounds (``True``: it is about to wait in a
        collective elsewhere, such as an evaluation's barrier) or is back. Rounds then close
        without it, so a worker still pushing is never left waiting for a quorum that the
        idle ones cannot make."""
        op = Op.IDLE if idle else Op.ACTIVE
        try:
            for sock in self.links.socks:
                sock.sendall(HEADER.pack(op, self.rank, -1, 0, 0))
        except OSError as exc:
            raise CommunicationError(f"rank {self.rank}: telling the shards it is "
                                     f"{'idle' if idle else 'back'}: {exc or type(exc).__name__}") from None

    def pull_settled(self, stay_idle: bool = False) -> None:
        """Collective: leave the rounds, wait for every worker (barrier), come back (unless
        ``stay_idle``: a worker kept out of the rounds), pull every shard's block, and wait
        for every worker again.

        Leaving first lets a worker still pushing close its rounds alone rather than wait
        for a quorum of workers that are in this barrier. Coming back goes out before the
        pull on each connection, so a shard's answer to the pull means it has this worker
        back; after the second barrier every shard has every worker back before anyone
        pushes. (Coming back after the barrier instead let the first worker's next push
        find itself the only active worker, close the round alone, and run ahead of the
        others; one run of sync-switch with two CPU stragglers stalled that way.)"""
        self.set_idle(True)
        self.comm.barrier()
        if not stay_idle:
            self.set_idle(False)
        self.pull()
        self.comm.barrier()

    def momentum(self) -> np.ndarray:
        return self.shard.sgd.momentum()

    def set_momentum(self, buffer: np.ndarray) -> None:
        self.shard.sgd.set_momentum(buffer)

    def stats(self) -> dict[str, object]:
        """This rank's shard: rounds closed, the workers each applied, stale pushes dropped,
        block messages delayed."""
        return dict(self.shard.stats(), delayed=self.delayed)

    def close(self) -> None:
        with self._fresh:
            self._closing = True
        self.links.close()
