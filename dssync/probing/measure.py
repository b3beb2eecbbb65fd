"""The probe's measurement primitives: the ``ProbeConfig`` of what to send, blocking
send/recv with the probe's timeout (``Link``), a latency ping-pong, timed streams (one, or
many at once), and the ``iperf3`` server and client.

``dssync.probing.probe`` runs them in its phases.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dssync.collectives.base import Communicator
from dssync.collectives.sockets import interface_address
from dssync.errors import BackendUnavailableError, CommunicationError

_TAG = 0x5D5  # probe messages on their own tag, apart from any other send/recv on the world
WINDOW = 2  # a stream's unacked messages: one on the wire while the next waits behind it


@dataclass(frozen=True)
class ProbeConfig:
    """What to send. Defaults measure a real network; tests shrink them to stay fast."""

    message_bytes: int = 2**19
    bandwidth_seconds: float = 0.25
    latency_reps: int = 20
    latency_bytes: int = 8
    latency_seconds: float = 0.1
    timeout_s: float = 60.0
    iperf_seconds: int = 1
    iperf_omit: int = 0  # iperf3 -O: seconds of each test not counted (slow start)
    isolated: bool = False  # one pair at a time: N(N-1)/2 rounds, nothing shared

    def __post_init__(self) -> None:
        for name in ("message_bytes", "latency_reps", "latency_bytes", "iperf_seconds"):
            if getattr(self, name) < 1:
                raise ValueError(f"probe {name} must be at least 1, got {getattr(self, name)}")
        for name in ("bandwidth_seconds", "latency_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"probe {name} must be positive, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ValueError(f"probe timeout must be positive seconds, got {self.timeout_s}")
        if self.iperf_omit < 0:
            raise ValueError(f"probe iperf_omit must be 0 or more seconds, got {self.iperf_omit}")


class Link:
    """The probe's point-to-point messages over the job's ``Communicator`` (gloo, MPI or
    Horovod's TCP side channel), on the probe's own tag; every wait is bounded by the
    communicator's timeout, and a failure names this rank, the peer and the step."""

    def __init__(self, comm: Communicator) -> None:
        self.comm, self.rank = comm, comm.rank

    def wait(self, work: Any, peer: int, what: str) -> None:
        self._wait([(work, peer)], what)

    def _wait(self, works: list[tuple[Any, int]], what: str) -> None:
        for work, peer in works:
            try:
                work.wait()
            except CommunicationError as exc:
                raise CommunicationError(f"rank {self.rank}: probe {what} with peer {peer} failed/timed out "
                                         f"(timeout {self.comm.timeout_s:.0f} s): {_first_line(exc)}") from None

    def start(self, send: bool, tensor: torch.Tensor, peer: int, what: str) -> Any:
        try:
            return (self.comm.isend if send else self.comm.irecv)(tensor, peer, _TAG)
        except CommunicationError as exc:
            raise CommunicationError(f"rank {self.rank}: probe {what} with peer {peer} failed: "
                                     f"{_first_line(exc)}") from None

    def send(self, tensor: torch.Tensor, peers: list[int], what: str) -> None:
        self._wait([(self.start(True, tensor, p, what), p) for p in peers], what)

    def recv(self, tensors: list[torch.Tensor], peers: list[int], what: str) -> None:
        works = [(self.start(False, t, p, what), p) for t, p in zip(tensors, peers, strict=True)]
        self._wait(works, what)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def ping_pong(link: Link, peer: int, lead: bool, cfg: ProbeConfig, quantile: float = 0.0) -> float | None:
    """One-way latency (µs, RTT / 2 at ``quantile`` of the round trips, the fastest by
    default) measured by the leader, ``None`` on the follower.

    The fastest, not the median, round trip: queueing and scheduling only ever add delay, and
    on an oversubscribed machine they add a lot (two concurrent pairs on a 2-core VM: median
    RTT 4 ms, one scheduler tick, against a fastest of 0.1 to 0.4 ms, measured here). At most
    ``cfg.latency_reps`` round trips, and no more once ``cfg.latency_seconds`` have passed (a
    path through a saturated queue has ms round trips); the first byte of each ping tells
    the follower whether another follows.
    """
    buf = torch.zeros(max(1, cfg.latency_bytes), dtype=torch.uint8)
    if not lead:
        while True:
            link.recv([buf], [peer], "latency ping")
            more = buf[0].item() != 0
            link.send(buf, [peer], "latency pong")
            if not more:
                return None
    rtts: list[float] = []
    start = time.perf_counter()
    for k in range(cfg.latency_reps + 1):  # the first exchange warms the connection up
        last = k == cfg.latency_reps or (k > 0 and time.perf_counter() - start >= cfg.latency_seconds)
        buf[0] = 0 if last else 1
        t0 = time.perf_counter()
        link.send(buf, [peer], "latency ping")
        link.recv([buf], [peer], "latency pong")
        if k:
            rtts.append(time.perf_counter() - t0)
        if last:
            break
    return float(np.quantile(rtts, quantile)) / 2 * 1e6


def timed_stream(link: Link, peer: int, send: bool, cfg: ProbeConfig, payload: torch.Tensor,
                 what: str = "bandwidth") -> float | None:
    """Sender-side Gbit/s of a timed stream (``iperf3 -t`` style), ``None`` on the receiver.

    The receiver acks every ``payload``-sized message, until a one-byte message whose byte
    is 0 says the stream is over. One warm-up message (TCP slow start, socket buffers) goes
    first; the clock starts at its ack and the rate is the bytes sent after it over the time
    to the last one's ack. Every flow of a round sends until the same deadline,
    ``cfg.bandwidth_seconds`` after it began, so flows that leave a rack together share its
    uplink for all of it (the only sign, pairwise, of an oversubscribed uplink whose
    single-flow rate equals a NIC's), as in an ``iperf3 -t`` test of the same span.

    The acks bound the stream's tail: at most ``WINDOW`` messages are unacked, so one
    message at most is still on its way when the deadline comes. Without them the socket
    buffers (megabytes) still held data then, and a flow starved behind another job's
    streams took up to a second to drain them (a round of 0.25 s took 1.4 s on
    ``inter-rack+nic``).
    """
    if not send:
        ack = torch.zeros(1, dtype=torch.uint8)
        while True:
            link.recv([payload], [peer], f"{what} recv")  # gloo takes a shorter message into it
            if payload[0].item() == 0:
                return None
            link.send(ack, [peer], f"{what} ack")
    size = payload.numel()
    payload[0] = 1
    acks: deque[Any] = deque()

    def post() -> None:
        link.send(payload, [peer], f"{what} send")
        acks.append(link.start(False, torch.zeros(1, dtype=torch.uint8), peer, f"{what} ack"))

    def acked() -> float:
        link.wait(acks.popleft(), peer, f"{what} ack")
        return time.perf_counter()

    begin = time.perf_counter()
    post()  # the warm-up
    t0 = t_end = acked()
    timed = 0  # messages acked after the clock started
    while True:
        if len(acks) >= WINDOW:
            t_end, timed = acked(), timed + 1
        if time.perf_counter() >= begin + cfg.bandwidth_seconds:
            break
        post()
    while acks:
        t_end, timed = acked(), timed + 1
    link.send(torch.zeros(1, dtype=torch.uint8), [peer], f"{what} stop")
    if not timed:  # the warm-up took the whole span: its own rate is all there is
        return size * 8 / (t0 - begin) / 1e9
    return timed * size * 8 / (t_end - t0) / 1e9


class Iperf3:
    """An ``iperf3 -s`` on this rank's address (the ``GLOO_SOCKET_IFNAME`` interface) and a
    client towards any peer's; ports are offset by rank so local ranks can share an address."""

    def __init__(self, comm: Communicator, cfg: ProbeConfig, base_port: int) -> None:
        if shutil.which("iperf3") is None:
            raise BackendUnavailableError(
                "--backend iperf3 needs the iperf3 program; install it (apt-get install iperf3) "
                "or use --backend builtin"
            )
        self.rank, self.cfg = comm.rank, cfg
        addr = interface_address(os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
        port = base_port + comm.rank
        self.server = subprocess.Popen(["iperf3", "-s", "-B", addr, "-p", str(port)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.peers: list[tuple[str, int]] = comm.allgather_object((addr, port))

    def client(self, peer: int, *, reverse: bool) -> float:
        """Gbit/s from this rank to ``peer`` (``reverse``: from ``peer`` to this rank)."""
        addr, port = self.peers[peer]
        argv = ["iperf3", "-c", addr, "-p", str(port), "-t", str(self.cfg.iperf_seconds),
                "-O", str(self.cfg.iperf_omit), "-J",
                *(["-R"] if reverse else [])]
        what = f"iperf3 {'-R ' if reverse else ''}client to {addr}:{port}"
        deadline = time.monotonic() + self.cfg.timeout_s
        while True:
            try:
                proc = subprocess.run(argv, capture_output=True, text=True,
                                      timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise CommunicationError(
                    f"rank {self.rank}: probe {what} with peer {peer} failed/timed out after "
                    f"{self.cfg.timeout_s:.0f} s; raise --timeout or check the network"
                ) from None
            try:
                report = json.loads(proc.stdout)
            except json.JSONDecodeError:
                report = {"error": (proc.stderr.strip().splitlines() or ["no output"])[0]}
            if "error" not in report:
                return float(report["end"]["sum_received"]["bits_per_second"]) / 1e9
            # The peer's server may not listen yet (it started moments ago) or still be busy.
            if time.monotonic() > deadline - 1.0:
                raise CommunicationError(
                    f"rank {self.rank}: probe {what} with peer {peer} failed/timed out: {report['error']}"
                )
            time.sleep(0.2)

    def close(self) -> None:
        self.server.terminate()
        try:
            self.server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()


def concurrent_streams(link: Link, rank: int, flows: list[tuple[int, int]], cfg: ProbeConfig,
                       what: str) -> dict[tuple[int, int], float]:
    """Run every ``(src, dst)`` flow at once for ``cfg.bandwidth_seconds``, each at its own
    pace; return ``{(rank, dst): Gbit/s}`` for the flows this rank sent.

    The timed-stream protocol of ``timed_stream``, one thread per flow end, so flows are
    independent: a flow held back by its path sends less without holding back this rank's
    other flows (a NIC that is not the bottleneck shows as the sum of its flows). Each flow's
    clock runs from the sink's ack of its warm-up message to the ack of its last one.
    """
    dsts = [d for s, d in flows if s == rank]
    srcs = [s for s, d in flows if d == rank]
    if not dsts and not srcs:
        return {}
    with ThreadPoolExecutor(max_workers=len(dsts) + len(srcs)) as pool:
        def start(peer: int, send: bool) -> Any:  # a buffer of its own per flow end
            payload = torch.zeros(cfg.message_bytes, dtype=torch.uint8)
            return pool.submit(timed_stream, link, peer, send, cfg, payload, what)

        sends = {d: start(d, True) for d in dsts}
        recvs = [start(s, False) for s in srcs]
        for job in recvs:
            job.result()
        return {(rank, d): float(job.result()) for d, job in sends.items()}
