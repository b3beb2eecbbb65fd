"""What a shard does with the gradients it receives: the shard rules, one per protocol family.

Both rules hold one contiguous slice of the flat parameter vector and update it with
``torch.optim.SGD`` on that slice (``ShardSGD``), so the loop's momentum, dampening, weight
decay and Nesterov all hold on the servers as they would in the loop. They differ in *when*
they step:

- ``ImmediateShard`` (ASP, SSP): every push is one step, at once; SSP holds the answer to a
  worker back until the staleness bound lets it go on (``wait_fresh``).
- ``RoundShard`` (PSP, Sync-Switch's BSP phase): pushes on the shard's current version join
  a round, stale ones are dropped, and the round is one step on the mean gradient of the
  ``k`` workers, after which the new block goes out to every worker (``on_round``).

The transport (``dssync.ps.links``) and the servers (``dssync.ps.server``,
``dssync.ps.partial``) own a rule; docs/parameter-server.md describes the protocols.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

__all__ = ["ImmediateShard", "RoundShard", "ShardSGD"]


class ShardSGD:
    """``torch.optim.SGD`` over one shard's parameters (a float32 numpy array, updated in place).

    ``sgd`` are ``torch.optim.SGD``'s keyword arguments (``lr``, ``momentum``, ``dampening``,
    ``weight_decay``, ``nesterov``, ``maximize``). ``lock`` is the shard's: a step runs under
    it (the rule takes it), and reading or taking over the momentum takes it here."""

    def __init__(self, params: np.ndarray, lock: AbstractContextManager[Any], **sgd: Any) -> None:
        self.lock = lock
        self.param = torch.from_numpy(params)  # shares the array's memory
        self.optimizer = torch.optim.SGD([self.param], **sgd)

    def step(self, grad: np.ndarray) -> None:
        """One SGD step on ``grad`` (not kept)."""
        self.param.grad = torch.from_numpy(grad)
        try:
            self.optimizer.step()
        finally:
            self.param.grad = None

    def momentum(self) -> np.ndarray:
        """A copy of the momentum buffer (zeros before the first step, as SGD's own start)."""
        with self.lock:
            buf = self.optimizer.state[self.param].get("momentum_buffer")
            return np.zeros_like(self.param.numpy()) if buf is None else buf.numpy().copy()

    def set_momentum(self, buffer: np.ndarray) -> None:
        """Take over a momentum buffer (a predecessor's, before this shard's first step)."""
        with self.lock:
            self.optimizer.state[self.param]["momentum_buffer"] = torch.from_numpy(np.array(buffer, dtype=np.float32))


class ImmediateShard:
    """Apply-at-once: one shard's parameters, SGD, version and the workers' clocks."""

    def __init__(self, params: np.ndarray, num_workers: int, *, sgd: dict[str, Any], staleness: int | None,
                 timeout_s: float) -> None:
        self.params = params
        self.lock = threading.RLock()  # what every reader and writer of the shard holds
        self.cond = threading.Condition(self.lock)
        self.sgd = ShardSGD(params, self.lock, **sgd)
        self.version = 0
        self.clocks = [0] * num_workers
        self.staleness = staleness
        self.timeout_s = timeout_s

    def apply(self, worker: int, clock: int, grad: np.ndarray) -> None:
        """One step on ``worker``'s gradient of iteration ``clock``; its clock becomes ``clock + 1``."""
        with self.cond:
            self.sgd.step(grad)
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

    def stats(self) -> dict[str, object]:
        return {}


class RoundShard:
    """Rounds: one shard's parameters, SGD and round, and the pushes of the open round.

    ``quorum`` (c) pushes close a round, after ``tau1_s`` more seconds for the rest; a round
    steps on ``sum / k`` (the linear scaling rule on the ``d`` pushes it holds: the loop's rate
    is a full round's) and hands the new block and version to ``on_round``."""

    def __init__(self, params: np.ndarray, num_workers: int, *, sgd: dict[str, Any], quorum: int,
                 tau1_s: float, on_round: Callable[[np.ndarray, int], None]) -> None:
        self.params = params
        self.lock = threading.Lock()
        self.sgd = ShardSGD(params, self.lock, **sgd)
        self.k, self.quorum, self.tau1_s = num_workers, quorum, tau1_s
        self.version = 0
        self.sum = np.zeros_like(params)
        self.joined: set[int] = set()
        self.responded: set[int] = set()  # workers that pushed anything while this round was open
        self.active: set[int] = set(range(num_workers))
        self._timer_round = -1
        self.dropped = 0
        self.joined_by_round: list[list[int]] = []  # the workers each closed round applied
        self.on_round = on_round

    def push(self, worker: int, version: int, grad: np.ndarray) -> None:
        """A worker's gradient computed on ``version``: joins the open round or is dropped."""
        with self.lock:
            self.responded.add(worker)
            if version != self.version or worker in self.joined:
                self.dropped += 1
            else:
                self.sum += grad
                self.joined.add(worker)
            self._maybe_close()

    def _need(self) -> int:
        """Pushes that close the round: c, or fewer when fewer workers can still push (the
        others are idle: in an evaluation's collective, or done)."""
        return max(1, min(self.quorum, len(self.active | self.joined)))

    def _maybe_close(self) -> None:
        """Close the round (lock held) once it holds c pushes (after ``tau1`` more seconds),
        or at once when every active worker has pushed since it opened, stale pushes
        included: a worker whose blocks are stale pushes stale gradients, and a round that
        waited for its fresh ones could wait on a worker that waits on this shard's block."""
        if not self.joined:
            return
        if self.active <= self.responded or (len(self.joined) >= self._need() and self.tau1_s <= 0):
            self._close()
        elif len(self.joined) >= self._need() and self._timer_round != self.version:
            self._timer_round = self.version
            timer = threading.Timer(self.tau1_s, self._close_if, args=(self.version,))
            timer.daemon = True
            timer.start()

    def set_active(self, worker: int, active: bool) -> None:
        """A worker stops pushing for a while (``False``) or comes back. An idle worker's
        absence must not hold a round open."""
        with self.lock:
            (self.active.add if active else self.active.discard)(worker)
            self._maybe_close()

    def _close_if(self, round_: int) -> None:
        with self.lock:
            if self.version == round_:
                self._close()

    def _close(self) -> None:
        """Apply the round (lock held): one SGD step on ``sum / k``, then broadcast."""
        self.sum /= self.k
        self.sgd.step(self.sum)
        self.joined_by_round.append(sorted(self.joined))
        self.version += 1
        self.sum[:] = 0
        self.joined.clear()
        self.responded.clear()
        self.on_round(self.params.copy(), self.version)

    def stats(self) -> dict[str, object]:
        """Rounds closed, the workers each applied, stale pushes dropped."""
        with self.lock:
            return {"rounds": self.version, "joined": [list(j) for j in self.joined_by_round],
                    "dropped": self.dropped}
