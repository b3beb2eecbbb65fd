"""SpecSync's central scheduler, its worker client and its adaptive tuning (the speculative synchronization paper).

Under asynchronous SGD a worker pulls the parameters only when an iteration starts, so every
push other workers make while it computes is invisible to it until the next one. SpecSync
lets a worker start at once, as in ASP, but watches the pushes: if "enough" pushes by others
arrive within ``ABORT_TIME`` of a worker's start, the scheduler tells it to re-sync; the
worker abandons the computation, pulls again and recomputes the same mini-batch.

- **Control channel.** One TCP connection per worker to a scheduler thread on rank 0, off
  the parameter servers' data path (the servers are unchanged). A worker sends
  ``NOTIFY(worker, iteration)`` right after each push-and-pull, which is also the start of
  its next iteration; the scheduler answers, at most once per iteration, ``RESYNC(iteration)``.
- **The scheduler** keeps the arrival times of every notify (its own clock, so no clock sync
  is needed) and a timer per notify: ``ABORT_TIME`` after worker ``i`` started iteration
  ``t`` it counts the pushes of the *other* workers since then and sends ``RESYNC(t)`` if
  the count reaches the worker's threshold.
- **Adaptive tuning** (``tune``, the paper's Algorithm 1) runs on the scheduler at the start
  of every scheduler epoch (``m`` notifies, one iteration's worth from every worker): from the
  last epoch's push log it picks the ``ABORT_TIME`` that maximizes the estimated freshness
  gain minus loss, Eq. 7.

Choices the speculative-synchronization paper leaves open, made here:

1. Gain ``u_j(D)`` of the iteration started at notify ``j``: the pushes by *other* workers in
   ``(t_j, t_j + D]`` within the same epoch (tuning runs as the epoch ends); the candidates ``D`` are the positive differences between any two pushes
   of the last epoch, same worker included.
2. Loss: ``(m - 1) D / T_i`` with ``T_i`` worker ``i``'s own iteration span, an exponentially
   weighted mean (weight 0.3) of the spacing of its notifies; the abort threshold is per
   worker, too: worker ``i`` re-syncs when the others' pushes reach ``(m - 1) D / T_i`` (``>=``,
   not rounded), i.e. exactly when its estimated gain reaches its estimated loss (Eq. 6-7);
   the reported ``ABORT_RATE`` is Algorithm 1's, with the mean span.
3. ``ABORT_TIME`` is re-tuned every epoch from the raw argmax (no running mean), at most half
   the mean iteration span (the paper's search-space bound); where no ``D`` has a positive
   estimated net gain, or in the first epoch (no history), the scheduler does not speculate.
4. At most one re-sync per iteration: the scheduler arms one timer per notify, and a restart
   sends no notify.
"""

from __future__ import annotations

import heapq
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dssync.collectives import Communicator
from dssync.errors import CommunicationError
from dssync.ps.framing import accept_each, connect, local_address, recv_exact, refuse

__all__ = ["Scheduler", "SchedulerClient", "Tuning", "tune"]

_MSG = struct.Struct("!BHq")  # op, worker, iteration
_NOTIFY, _RESYNC, _STOP = 1, 2, 3
SPAN_WEIGHT = 0.3


@dataclass(frozen=True)
class Tuning:
    abort_time_s: float
    """The speculation window (0: do not speculate)."""
    abort_rate: float
    """Algorithm 1's ABORT_RATE: ``abort_time (m - 1) / (T m)`` with the mean span T."""
    net_gain: float
    """Eq. 7's estimate at ``abort_time`` (pushes uncovered minus pushes missed, per epoch)."""


def net_gain(delta: float, times: np.ndarray, workers: np.ndarray, spans: np.ndarray, m: int) -> float:
    """Eq. 7 over one epoch's notifies (each a push and the start of that worker's next
    iteration): sum over the starts of (others' pushes in (t, t + delta]) - (m - 1) delta / T_i."""
    window = (times[:, None] < times[None, :]) & (times[None, :] <= times[:, None] + delta)
    gain = (window & (workers[:, None] != workers[None, :])).sum()
    return float(gain - (m - 1) * delta * (1.0 / spans[workers]).sum())


def tune(epoch: Sequence[tuple[float, int]], spans: Mapping[int, float], m: int, *,
         max_fraction: float = 0.5) -> Tuning:
    """Algorithm 1: the ``ABORT_TIME`` with the greatest estimated net freshness gain.

    ``epoch``: the last epoch's notifies ``(time, worker)``, each a push and the start of
    that worker's next iteration; ``spans``: each worker's iteration span (s). Candidates are
    the positive differences of the epoch's push times, up to ``max_fraction`` of the mean
    span.
    """
    if not epoch or len(spans) < m or m < 2:
        return Tuning(0.0, 0.0, 0.0)
    span = np.array([spans[w] for w in range(m)], dtype=float)
    mean_span = float(span.mean())
    times = np.array([t for t, _ in epoch])
    workers = np.array([w for _, w in epoch])
    diffs = np.abs(times[:, None] - times[None, :]).ravel()
    candidates = np.unique(diffs[(diffs > 0) & (diffs <= max_fraction * mean_span)])
    best = Tuning(0.0, 0.0, 0.0)
    for delta in candidates:
        f = net_gain(float(delta), times, workers, span, m)
        if f > best.net_gain:
            best = Tuning(float(delta), float(delta) * (m - 1) / (mean_span * m), f)
    return best


class Scheduler:
    """The central scheduler, served from a thread of rank 0 (fixed or adaptive mode).

    ``abort_time_s`` > 0 with ``abort_rate``: fixed mode, worker ``i`` re-syncs when the
    others' pushes in the window reach ``abort_rate * m``. ``abort_time_s`` == 0: adaptive.
    """

    def __init__(self, m: int, *, abort_time_s: float = 0.0, abort_rate: float = 0.0,
                 max_fraction: float = 0.5, timeout_s: float = 300.0, secret: bytes) -> None:
        self._secret = secret  # what a worker's connection must prove it holds (``ps.job_secret``)
        self.m, self.fixed = m, abort_time_s > 0
        self.tuning = Tuning(abort_time_s, abort_rate, 0.0)
        self.max_fraction = max_fraction
        self.log: list[tuple[float, int]] = []
        self.tunings: list[Tuning] = []
        self.resyncs = [0] * m
        self._epoch_start = 0
        self._last: dict[int, float] = {}
        self._spans: dict[int, float] = {}
        self._timers: list[tuple[float, int, int, float, float]] = []  # due, worker, iteration, start, threshold
        self._lock = threading.Condition()
        self._socks: dict[int, socket.socket] = {}
        self._send_locks = [threading.Lock() for _ in range(m)]
        self._stopped = False
        self._listener = socket.create_server((local_address(), 0), backlog=m)
        self._listener.settimeout(timeout_s)
        self.address = self._listener.getsockname()[:2]
        self._threads = [threading.Thread(target=self._accept, name="specsync-accept", daemon=True),
                         threading.Thread(target=self._timer_loop, name="specsync-timers", daemon=True)]
        for t in self._threads:
            t.start()

    def _accept(self) -> None:
        accept_each(self._listener, self.m, self._serve, "the SpecSync scheduler", self._threads, secret=self._secret)

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray(_MSG.size)
        with conn:
            while True:
                try:
                    recv_exact(conn, memoryview(buf))
                except (ConnectionError, OSError):
                    return
                op, worker, iteration = _MSG.unpack(buf)
                if op == _STOP:
                    return
                if op != _NOTIFY or worker >= self.m:
                    refuse(conn, "the SpecSync scheduler", f"a malformed frame (operation {op}, worker {worker})")
                    return
                with self._lock:
                    self._socks.setdefault(worker, conn)
                    self.notify(worker, iteration, time.monotonic())

    def notify(self, worker: int, iteration: int, now: float) -> None:
        """Record a push by ``worker`` that starts its ``iteration``; arm its timer (lock held)."""
        if worker in self._last:
            span = now - self._last[worker]
            old = self._spans.get(worker)
            self._spans[worker] = span if old is None else (1 - SPAN_WEIGHT) * old + SPAN_WEIGHT * span
        self._last[worker] = now
        self.log.append((now, worker))
        if not self.fixed and len(self.log) - self._epoch_start >= self.m:  # an epoch has ended
            epoch = self.log[self._epoch_start:]
            self._epoch_start = len(self.log)
            self.tuning = tune(epoch, self._spans, self.m, max_fraction=self.max_fraction)
            self.tunings.append(self.tuning)
        delta = self.tuning.abort_time_s
        if delta <= 0:
            return
        if self.fixed:
            threshold = self.tuning.abort_rate * self.m
        elif worker in self._spans:
            threshold = delta * (self.m - 1) / self._spans[worker]
        else:
            return
        heapq.heappush(self._timers, (now + delta, worker, iteration, now, threshold))
        self._lock.notify_all()

    def _timer_loop(self) -> None:
        with self._lock:
            while not self._stopped:
                if not self._timers:
                    self._lock.wait(0.5)
                    continue
                due = self._timers[0][0]
                now = time.monotonic()
                if due > now:
                    self._lock.wait(due - now)
                    continue
                _, worker, iteration, start, threshold = heapq.heappop(self._timers)
                count = 0
                for t, w in reversed(self.log):
                    if t <= start:
                        break
                    count += t <= due and w != worker
                if count >= threshold:
                    self.resyncs[worker] += 1
                    self._send(worker, _RESYNC, iteration)

    def _send(self, worker: int, op: int, iteration: int) -> None:
        sock = self._socks.get(worker)
        if sock is None:
            return
        with self._send_locks[worker]:
            try:
                sock.sendall(_MSG.pack(op, worker, iteration))
            except OSError:
                pass  # the worker has gone; its own client reports what went wrong

    def close(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes an accept still waiting
        except OSError:
            pass
        self._listener.close()
        for t in self._threads:
            t.join(timeout=5)


class SchedulerClient:
    """A worker's end of the control channel: sends notifies, turns re-syncs into a flag
    for the iteration they name (stale ones, for an iteration already over, are dropped)."""

    def __init__(self, comm: Communicator, address: tuple[str, int] | None, *, timeout_s: float,
                 secret: bytes) -> None:
        self.rank = comm.rank
        addr = comm.allgather_object(address)[0]
        self._sock = connect(tuple(addr), timeout_s, f"rank {self.rank}: cannot reach the SpecSync scheduler on rank 0",
                             secret=secret, worker=self.rank)
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._iteration = -1
        self._resync_for = -2
        self.resync = threading.Event()
        self._reader = threading.Thread(target=self._read, name=f"specsync-client-{self.rank}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = bytearray(_MSG.size)
        while True:
            try:
                recv_exact(self._sock, memoryview(buf))
            except (ConnectionError, OSError):
                return
            op, _, iteration = _MSG.unpack(buf)
            if op == _RESYNC:
                with self._lock:
                    self._resync_for = iteration
                    if iteration == self._iteration:
                        self.resync.set()

    def begin(self, iteration: int) -> None:
        """This worker now computes ``iteration``: a re-sync that already came for it stands."""
        with self._lock:
            self._iteration = iteration
            if self._resync_for == iteration:
                self.resync.set()
            else:
                self.resync.clear()

    def end(self) -> None:
        """The iteration's computation is over (finished or restarted): no more aborts."""
        with self._lock:
            self._iteration = -1
            self.resync.clear()

    def notify(self, iteration: int) -> None:
        try:
            self._sock.sendall(_MSG.pack(_NOTIFY, self.rank, iteration))
        except OSError as exc:
            raise CommunicationError(f"rank {self.rank}: notify for iteration {iteration} to the SpecSync "
                                     f"scheduler on rank 0 failed: {exc}") from None

    def close(self) -> None:
        try:
            self._sock.sendall(_MSG.pack(_STOP, self.rank, 0))
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=5)
