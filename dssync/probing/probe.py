"""The built-in prober: pairwise latency and bandwidth over torch.distributed (gloo) send/recv.

Run ``probe_rank(comm, config)`` on every rank (``dssync.launch.run_ranks``). Pairs are
measured in the rounds of a round-robin tournament (circle method): every round is a set
of disjoint pairs that measure at the same time, so ``N`` ranks need ``N - 1`` rounds
(``N`` when ``N`` is odd, one rank sitting out each round) rather than ``N (N - 1) / 2``.
Pairwise tests alone cannot see an oversubscribed uplink that only saturates when a whole
rack talks at once, so a second phase infers the racks and then, rack by rack, has all
members of a rack send across racks at the same time (paper §III: the contention DS-Sync's
grouping adapts to). The gathered result is the same on every rank.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dssync.collectives.base import Communicator
from dssync.errors import BackendUnavailableError, CommunicationError
from dssync.topology.infer import (
    SHARP_RATIO,
    RackFit,
    classify_contention,
    clear_latency,
    fan_clears,
    filled,
    fit_racks,
    nic_suspects,
    place_behind_standing_queue,
    place_blind,
    queued_ranks,
)
from dssync.topology.model import Topology, Worker

__all__ = [
    "BACKENDS",
    "ProbeConfig",
    "ProbeResult",
    "blast_flows",
    "host_name",
    "interface_address",
    "probe_rank",
    "round_robin_rounds",
]

BACKENDS = ("builtin", "iperf3")
_TAG = 0x5D5  # probe messages on their own tag, apart from any other send/recv on the world
_WINDOW = 2  # a stream's unacked messages: one on the wire while the next waits behind it


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


@dataclass(frozen=True)
class ProbeResult:
    """Everything the probe found (identical on every rank)."""

    hosts: list[str]
    latency_us: np.ndarray
    bandwidth_gbps: np.ndarray
    racks: list[int]
    contention: dict[str, Any]
    rounds: int
    started_at: float  # time.time() when the process group was ready, for the wall time
    confidence: dict[str, Any] | None = None

    def to_topology(self, probe: dict[str, Any]) -> Topology:
        """The ``topology.json`` contract of what was found, with ``probe`` as its probe record."""
        return Topology(workers=tuple(Worker(rank=r, host=h, rack=k)
                                      for r, (h, k) in enumerate(zip(self.hosts, self.racks, strict=True))),
                        latency_us=self.latency_us, bandwidth_gbps=self.bandwidth_gbps,
                        contention=self.contention, probe=probe, confidence=self.confidence)


def host_name() -> str:
    """This rank's host: ``DSSYNC_HOST`` (set by ``dssync emulate run``), else the hostname."""
    return os.environ.get("DSSYNC_HOST", socket.gethostname())


def round_robin_rounds(num_ranks: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs in which every pair of ``0..num_ranks-1`` meets exactly once.

    Circle method: rank ``n-1`` (or a bye when ``n`` is odd) stays put while the others
    rotate one place per round; ``n - 1`` rounds for even ``n``, ``n`` for odd. Pairs are
    ``(low, high)``.
    """
    if num_ranks < 1:
        raise ValueError(f"need at least one rank to schedule, got {num_ranks}")
    players: list[int | None] = list(range(num_ranks)) + ([None] if num_ranks % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = players[k], players[m - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        if pairs:  # a world of one has nothing to measure
            rounds.append(sorted(pairs))
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def blast_flows(racks: list[int], rack: int, quiet: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Flows of ``rack``'s egress blast: its members send across racks all at once.

    As many flows as the larger side has ranks, paired round-robin, so every member of the
    rack and every rank outside it carries at least one flow and the rack's uplink sees all
    of its members at once. No more than that: TCP shares a link per flow, so a blast of
    every member to every rank outside (16 flows on ``inter-rack``) took two thirds of an
    uplink from the 8 streams of another job and hid the contention (0.55 against 0.90
    Gbit/s, above the 0.6 rule), where 4 flows leave it a third. ``quiet`` ranks (the
    pingers of ``place_blind`` and the rank they ping) neither send nor receive.
    """
    skip = set(quiet)
    inside = [i for i, r in enumerate(racks) if r == rack and i not in skip]
    outside = [i for i, r in enumerate(racks) if r != rack and i not in skip]
    if not inside or not outside:
        return []
    return [(inside[k % len(inside)], outside[k % len(outside)]) for k in range(max(len(inside), len(outside)))]


class _Link:
    """Blocking send/recv with the probe's timeout; failures name this rank, the peer and the step."""

    def __init__(self, rank: int, timeout_s: float) -> None:
        self.rank, self.timeout = rank, datetime.timedelta(seconds=timeout_s)

    def wait(self, work: Any, peer: int, what: str) -> None:
        self._wait([(work, peer)], what)

    def _wait(self, works: list[tuple[Any, int]], what: str) -> None:
        for work, peer in works:
            try:
                work.wait(timeout=self.timeout)
            except RuntimeError as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise CommunicationError(
                    f"rank {self.rank}: probe {what} with peer {peer} failed/timed out "
                    f"(timeout {self.timeout.total_seconds():.0f} s): {first}"
                ) from None

    def start(self, op: Callable[..., Any], tensor: torch.Tensor, peer: int, what: str) -> Any:
        try:
            return op(tensor, peer, tag=_TAG)
        except RuntimeError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CommunicationError(f"rank {self.rank}: probe {what} with peer {peer} failed: {first}") from None

    def send(self, tensor: torch.Tensor, peers: list[int], what: str) -> None:
        self._wait([(self.start(dist.isend, tensor, p, what), p) for p in peers], what)

    def recv(self, tensors: list[torch.Tensor], peers: list[int], what: str) -> None:
        works = [(self.start(dist.irecv, t, p, what), p) for t, p in zip(tensors, peers, strict=True)]
        self._wait(works, what)


def _ping_pong(link: _Link, peer: int, lead: bool, cfg: ProbeConfig, quantile: float = 0.0) -> float | None:
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


def _stream(link: _Link, peer: int, send: bool, cfg: ProbeConfig, payload: torch.Tensor,
            what: str = "bandwidth") -> float | None:
    """Sender-side Gbit/s of a timed stream (``iperf3 -t`` style), ``None`` on the receiver.

    The receiver acks every ``payload``-sized message, until a one-byte message whose byte
    is 0 says the stream is over. One warm-up message (TCP slow start, socket buffers) goes
    first; the clock starts at its ack and the rate is the bytes sent after it over the time
    to the last one's ack. Every flow of a round sends until the same deadline,
    ``cfg.bandwidth_seconds`` after it began, so flows that leave a rack together share its
    uplink for all of it (the only sign, pairwise, of an oversubscribed uplink whose
    single-flow rate equals a NIC's), as in an ``iperf3 -t`` test of the same span.

    The acks bound the stream's tail: at most ``_WINDOW`` messages are unacked, so one
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
        acks.append(link.start(dist.irecv, torch.zeros(1, dtype=torch.uint8), peer, f"{what} ack"))

    def acked() -> float:
        link.wait(acks.popleft(), peer, f"{what} ack")
        return time.perf_counter()

    begin = time.perf_counter()
    post()  # the warm-up
    t0 = t_end = acked()
    timed = 0  # messages acked after the clock started
    while True:
        if len(acks) >= _WINDOW:
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


def _latency_pair(link: _Link, rank: int, peer: int, cfg: ProbeConfig) -> dict[tuple[int, int], float]:
    """``{(rank, peer): one-way µs}``; the lower rank leads first, then the roles swap."""
    low = rank < peer
    out = {}
    for lead in (low, not low):
        value = _ping_pong(link, peer, lead, cfg)
        if value is not None:
            out[rank, peer] = value
    return out


def _bandwidth_pair(link: _Link, rank: int, peer: int, upward: bool, cfg: ProbeConfig,
                    payload: torch.Tensor, iperf: _Iperf3 | None) -> dict[tuple[int, int], float]:
    """``{(src, dst): Gbit/s}`` for the one direction this rank timed: from the lower rank to
    the higher if ``upward``, else back. With iperf3 the lower rank runs the client both ways
    (``-R`` for the way back) and the higher rank's server answers."""
    low = rank < peer
    if iperf is not None:
        return {((rank, peer) if upward else (peer, rank)): iperf.client(peer, reverse=not upward)} if low else {}
    value = _stream(link, peer, low == upward, cfg, payload)
    return {} if value is None else {(rank, peer): value}


class _Iperf3:
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


def interface_address(ifname: str) -> str:
    """The first IPv4 address of ``ifname`` (``ip -j addr show dev IFNAME``)."""
    try:
        proc = subprocess.run(["ip", "-j", "addr", "show", "dev", ifname],
                              capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        raise BackendUnavailableError(
            "--backend iperf3 needs the ip program to find this rank's address; install iproute2"
        ) from None
    try:
        for link in json.loads(proc.stdout or "[]"):
            for info in link.get("addr_info", []):
                if info.get("family") == "inet":
                    return str(info["local"])
    except (json.JSONDecodeError, AttributeError, KeyError):
        pass
    raise CommunicationError(
        f"no IPv4 address on interface {ifname!r} (GLOO_SOCKET_IFNAME); set it to the interface "
        f"the ranks talk over: {(proc.stderr.strip().splitlines() or ['no address'])[0]}"
    )


def _streams(link: _Link, rank: int, flows: list[tuple[int, int]], cfg: ProbeConfig,
             what: str) -> dict[tuple[int, int], float]:
    """Run every ``(src, dst)`` flow at once for ``cfg.bandwidth_seconds``, each at its own
    pace; return ``{(rank, dst): Gbit/s}`` for the flows this rank sent.

    The timed-stream protocol of ``_stream``, one thread per flow end, so flows are
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
            return pool.submit(_stream, link, peer, send, cfg, payload, what)

        sends = {d: start(d, True) for d in dsts}
        recvs = [start(s, False) for s in srcs]
        for job in recvs:
            job.result()
        return {(rank, d): float(job.result()) for d, job in sends.items()}


def _phase(comm: Communicator, link: _Link, flows: list[tuple[int, int]], cfg: ProbeConfig, what: str,
           pings: Sequence[tuple[int, int]] = ()) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """``_streams`` on every rank after a barrier, with ``pings`` (``(pinger, echo)``) in the
    middle of it: every flow's Gbit/s and every pinger's one-way µs, on every rank.

    A pinger starts after a third of the stream time, when the queues the flows fill are
    full, and pings for the next third; an echo answers each of its pingers in a thread. It
    keeps the lower quartile of its round trips, not the fastest: TCP's flows now and then
    drain a queue for a moment, and a scheduling hiccup only delays a few pings.
    """
    comm.barrier()
    mine_pings: dict[tuple[int, int], float] = {}
    during = replace(cfg, latency_reps=10**6, latency_seconds=cfg.bandwidth_seconds / 3)
    jobs = [(a, b) for a, b in pings if comm.rank in (a, b)]
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        def ping(a: int, b: int) -> float | None:
            if comm.rank == a:
                time.sleep(cfg.bandwidth_seconds / 3)
            return _ping_pong(link, b if comm.rank == a else a, comm.rank == a, during, quantile=0.25)

        pending = {pair: pool.submit(ping, *pair) for pair in jobs}
        mine = _streams(link, comm.rank, flows, cfg, what)
        for pair, job in pending.items():
            value = job.result()
            if value is not None:
                mine_pings[pair] = value
    rates: dict[tuple[int, int], float] = {}
    waits: dict[tuple[int, int], float] = {}
    for part, part_pings in comm.allgather_object((mine, mine_pings)):
        rates.update(part)
        waits.update(part_pings)
    return rates, waits


def _echo(racks: list[int], rack: int, pingers: list[int], bw: np.ndarray, latency_us: np.ndarray,
          clear_us: float) -> int | None:
    """The quiet rank outside ``rack`` that the pingers ping during its blast.

    One whose idle pings from every pinger were clear (at most ``clear_us``), if any (a queue that other traffic
    keeps full on the way there or back would hide the blast's), and among those one in the
    rack that takes in traffic from other racks fastest (the blast sends there too).
    """
    outside = [i for i, r in enumerate(racks) if r != rack and i not in pingers]
    if len(outside) < 2:  # the blast needs a receiver besides the echo
        return None
    sym = (latency_us + latency_us.T) / 2.0

    def ingress(i: int) -> float:
        mates = [k for k, r in enumerate(racks) if r == racks[i] and k not in pingers]
        flows = [bw[k, m] for m in mates for k in range(len(racks)) if racks[k] != racks[i] and bw[k, m] > 0]
        return float(np.median(flows)) if flows else 0.0

    return min(outside, key=lambda i: (sum(sym[j, i] > clear_us for j in pingers), -ingress(i), -bw[:, i].max(), i))


#: ``_waits_on``: windows of pings, the pause before each, and the pings in one window;
#: ``_fans``: how many of a rank's nearest peers it is rechecked with at most
_RECHECK_WINDOWS, _RECHECK_GAP_S, _RECHECK_PINGS, _RECHECK_PEERS = 7, 0.02, 4, 8


def _waits_on(comm: Communicator, link: _Link, cfg: ProbeConfig, rank: int, peer: int) -> float:
    """One-way µs from ``rank`` to ``peer`` that most moments see, on every rank: the
    median over ``_RECHECK_WINDOWS`` windows, 20 ms apart, of each window's fastest ping.

    The pairs phase keeps a path's fastest ping of a burst, which tells a path from the CPU
    on a busy host but not a standing queue from a lull in it: another job's TCP streams
    back off together now and then, and a burst of pings that starts then runs entirely in
    the lull (at 0.1 ms a round trip, twenty take 2 ms). On a 2,3,3 layout with another
    job's two streams through rank 5's NIC, its pings once looked clear that way in CI, its
    fan of seven flows took 0.6 Gbit/s from those streams and cleared the NIC. Windows
    spread over 0.15 s each keep their fastest ping, so a scheduling hiccup still costs
    nothing, and the median of them is a lull only if most of that time was one.
    """
    window = replace(cfg, latency_reps=_RECHECK_PINGS, latency_seconds=_RECHECK_GAP_S / 2)
    mine = None
    if comm.rank in (rank, peer):
        other, lead = (peer, True) if comm.rank == rank else (rank, False)
        values = []
        for _ in range(_RECHECK_WINDOWS):
            if lead:
                time.sleep(_RECHECK_GAP_S)
            value = _ping_pong(link, other, lead, window)
            if value is not None:
                values.append(value)
        mine = float(np.median(values)) if lead else None
    return next(v for v in comm.allgather_object(mine) if v is not None)


def _fans(comm: Communicator, link: _Link, cfg: ProbeConfig, bw: np.ndarray, hosts: list[str],
          racks: list[int], queued: list[int], latency_us: np.ndarray,
          clear_us: float) -> tuple[dict[int, dict[str, dict[int, float]]], list[dict[str, Any]]]:
    """A fan for each rank whose pairs called its NIC slow (``nic_suspects``) and whose NIC
    has no standing queue (not ``queued``): it sends to, or takes from, every rank off its
    host at once, in each direction it looked slow. ``({rank: {direction: {peer: Gbit/s}}},
    the record)``. One fan at a time: two would meet at the peers they share.

    A ``queued`` rank (``queued_ranks``: its pings wait both ways, even to its nearest rank)
    sits behind a queue at its own NIC, another job's streams, and more flows would only
    take a larger share of them (TCP shares per flow), so a fan could not clear it and none
    is run. One clear ping is not enough: on a 5,4 layout with another job's two streams
    through rank 7's NIC, one ping reached it in 88 us while the others waited 0.9-1.4 ms,
    and its fan of eight flows carried 0.67 Gbit/s and cleared the NIC. Nor is one clear
    burst: before its fan, a rank is pinged again in windows spread over time
    (``_waits_on``), from its nearest ranks off its host in turn until one path is clear;
    one whose every path waits most of the time gets no fan either (in the record as
    ``{"rank", "skipped": "standing queue", "ping_us"}``, its best path's). Every path, not
    the nearest only: on a 1,3,1 layout with another job on the middle rack's uplink, the
    first rack's clear worker reached its nearest rank, in the middle rack, through that
    uplink's queue (2.6 ms), and the third rack's worker in 0.2 ms.
    """
    fans: dict[int, dict[str, dict[int, float]]] = {}
    record: list[dict[str, Any]] = []
    # Half the stream time and a quarter of the message: a fan tells a sum from one flow's
    # rate (a factor of two or more), and each of its flows is slow, so a whole message
    # sent after the clock ran out would add a tenth of a second at a slow NIC's rate.
    light = replace(cfg, bandwidth_seconds=cfg.bandwidth_seconds / 2, message_bytes=max(1, cfg.message_bytes // 4))
    for i, directions in nic_suspects(bw, hosts, queued=queued, racks=racks).items():
        if i in queued:
            continue
        peers = [j for j in range(len(hosts)) if hosts[j] != hosts[i]]
        if not peers:
            continue
        # Its nearest peers first: one clear path shows its NIC holds no queue
        ping_us = math.inf
        for j in sorted(peers, key=lambda j: (latency_us[i, j] + latency_us[j, i], j))[:_RECHECK_PEERS]:
            ping_us = min(ping_us, _waits_on(comm, link, cfg, i, j))
            if ping_us <= clear_us:
                break
        if ping_us > clear_us:
            record.append({"rank": i, "skipped": "standing queue", "ping_us": round(ping_us, 1)})
            continue
        # the slower direction first: a NIC stays slow unless every slow direction clears
        for d in sorted(directions, key=lambda d: bw[i].max() if d == "out" else bw[:, i].max()):
            flows = [(i, j) if d == "out" else (j, i) for j in peers]
            rates, _ = _phase(comm, link, flows, light, f"rank {i} fan-{d}")
            fans.setdefault(i, {})[d] = {(dst if d == "out" else src): v for (src, dst), v in rates.items()}
            record.append({"rank": i, "direction": d, "gbps": round(float(sum(rates.values())), 4),
                           "flows": len(rates)})
            if not fan_clears(bw, racks, i, d, fans[i][d]):
                break
    return fans, record


def probe_rank(comm: Communicator, cfg: ProbeConfig, backend: str = "builtin",
               racks: list[int] | None = None, base_port: int = 5301) -> ProbeResult:
    """Measure the world from this rank; every rank returns the same ``ProbeResult``.

    ``backend="iperf3"`` measures pairwise bandwidth with ``iperf3`` (server on port
    ``base_port + rank``) instead of gloo messages; latency and the concurrent uplink phase
    use gloo messages with either backend. ``racks`` (rack per rank, numbered in order of
    lowest rank) replaces the inferred racks, for a layout known in advance.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown probe backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if racks is not None and len(racks) != comm.world_size:
        raise ValueError(f"racks lists {len(racks)} ranks for a world of {comm.world_size}; "
                         "give one rack per rank")
    started_at = time.time()
    rank, n = comm.rank, comm.world_size
    link = _Link(rank, cfg.timeout_s)
    hosts = [str(h) for h in comm.allgather_object(host_name())]
    comm.barrier()
    payload = torch.zeros(cfg.message_bytes, dtype=torch.uint8)
    rounds = round_robin_rounds(n)
    if cfg.isolated:  # every pair alone: what a path gives one flow, for comparing backends
        rounds = [[pair] for pairs in rounds for pair in pairs]
    iperf = _Iperf3(comm, cfg, base_port) if backend == "iperf3" else None
    latency: dict[tuple[int, int], float] = {}
    bandwidth: dict[tuple[int, int], float] = {}
    try:
        if iperf is not None:
            comm.barrier()  # every server started before any client connects
        # All latency rounds first, then all bandwidth rounds: a ping-pong next to another
        # pair's bulk transfer would time the CPU and the queues that transfer fills.
        # Bandwidth one direction at a time, all pairs of a round together, a barrier after
        # each: every flow of a direction starts together and shares what it shares for
        # the whole of its stream, whichever backend times it.
        for kind, upward in (("latency", True), ("bandwidth", True), ("bandwidth", False)):
            for pairs in rounds:
                for a, b in pairs:
                    if rank in (a, b):
                        peer = b if rank == a else a
                        if kind == "latency":
                            latency.update(_latency_pair(link, rank, peer, cfg))
                        else:
                            bandwidth.update(_bandwidth_pair(link, rank, peer, upward, cfg, payload, iperf))
                comm.barrier()  # the next round's pairs must not overlap this one's
    finally:
        if iperf is not None:
            iperf.close()
    latency_us, bandwidth_gbps = np.zeros((n, n)), np.zeros((n, n))
    for lat_part, bw_part in comm.allgather_object((latency, bandwidth)):
        for (src, dst), value in lat_part.items():
            latency_us[src, dst] = value
        for (src, dst), value in bw_part.items():
            bandwidth_gbps[src, dst] = value
    phase_seconds = {"pairs": round(time.time() - started_at, 3)}
    known = racks is not None
    fit = (RackFit(n=n, groups=[[i for i in range(n) if racks[i] == r] for r in sorted(set(racks))],
                   metric="given") if known else fit_racks(latency_us, bandwidth_gbps, hosts))
    provisional = fit.racks()
    # Egress blasts, one per rack: its uplink with all of its members sending across at once
    # (the paper's contended uplink only shows when a whole rack talks), and, for every rank
    # the pairs could not place, a ping through the queue that fills only its own rack's uplink.
    pingers = [] if known else [j for j in sorted({*fit.unplaced, *fit.tentative}) if fit.candidates.get(j)]
    phases: list[dict[str, Any]] = []
    out_best = bandwidth_gbps.max(axis=1)
    clear_us = clear_latency(latency_us)
    queued = queued_ranks(latency_us)  # behind another job's queue at their own NIC
    # (group, pinger, echo, kind) -> the ping's one-way µs in each pass; kind: "out" from a
    # blind rank to a rank outside the group, "in" to a spare member, "spare" from it out
    passes: dict[tuple[int, int, int, str], list[float]] = {}
    full: dict[int, bool] = {}  # group -> its blast filled a queue at a link its members share
    if len(set(provisional)) > 1:
        # Two passes over the racks, each rack's best kept: a burst of CPU work on a busy
        # host only ever makes a link look slower, while a contended uplink is slow in both
        # passes. With one pass, an uncontended rack of the 3,2,4 layout once measured
        # 0.28 Gbit/s against the contended rack's 0.33 and was flagged with it.
        for g, members in [*enumerate(fit.groups)] * 2:
            rack = provisional[members[0]]
            echo = _echo(provisional, rack, pingers, bandwidth_gbps, latency_us, clear_us) if pingers else None
            # a member to spare (two still send), the one the pingers reach fastest at rest,
            # answers pings from the inside and pings out itself
            spare = (min(members, key=lambda i: (sum(latency_us[i, j] + latency_us[j, i] for j in pingers), i))
                     if echo is not None and len(members) >= 3 else None)
            quiet = [*pingers, *(e for e in (echo, spare) if e is not None)]
            flows = blast_flows(provisional, rack, quiet)
            kinds = {(j, echo): "out" for j in pingers if echo is not None}
            if spare is not None:
                kinds.update({(j, spare): "in" for j in pingers} | {(spare, echo): "spare"})
            rates, waits = _phase(comm, link, flows, cfg, f"rack {rack} egress", list(kinds) if flows else [])
            total = float(sum(rates.values()))
            if len(phases) == g:
                phases.append({"rack": rack, "egress_gbps": 0.0, "flows": len(rates)})
            phases[g]["egress_gbps"] = max(phases[g]["egress_gbps"], round(total, 4))
            senders = {src for src, _ in rates}
            # the members sent well below what their NICs carry alone: they share a link
            full[g] = full.get(g, False) or bool(
                senders and total < SHARP_RATIO * float(sum(out_best[i] for i in senders)))
            for pair, us in waits.items():
                passes.setdefault((g, *pair, kinds[pair]), []).append(us)
        # A queue is there in both passes, a scheduling hiccup in one: the lower pass counts.
        # The idle time is the lower of the pairs phase's and the blasts': a path that was
        # clear once is not behind a queue of other traffic.
        delays: dict[int, dict[int, dict[str, tuple[float, float]]]] = {j: {} for j in pingers}
        slow_up = {u["rack"] for u in classify_contention(bandwidth_gbps, provisional, hosts=hosts,
                                                         queued=queued)["uplinks"]}
        for (g, a, b, kind), values in passes.items():
            ping = (min(values), float(min(latency_us[a, b] or np.inf, latency_us[b, a] or np.inf, *values)))
            if kind == "spare":  # the spare member's own ping out says, better than the rates, whether it filled
                full[g] = filled(ping, clear_us, provisional[a] in slow_up)
            else:
                delays[a].setdefault(g, {})[kind] = ping
        # racks of blind ranks alone get no blast of their own: nothing clear to send
        place_blind(fit, delays, full, clear_us)
        place_behind_standing_queue(fit, latency_us, clear_us,
                                    [g for g, members in enumerate(fit.groups) if provisional[members[0]] in slow_up])
        racks = fit.racks()
    else:
        delays, racks = {}, provisional
    phase_seconds["blasts"] = round(time.time() - started_at - phase_seconds["pairs"], 3)
    # Phase g blasted group g: name it by its final rack. A rack of unplaced ranks alone had none.
    for g, p in enumerate(phases):
        p["rack"] = racks[fit.groups[g][0]]
    by_rack = {p["rack"]: p["egress_gbps"] for p in phases if p["flows"]}
    aggregates = [by_rack.get(r, float("nan")) for r in range(max(racks) + 1)] if phases else None
    fans, fan_record = _fans(comm, link, cfg, bandwidth_gbps, hosts, racks, queued, latency_us, clear_us)
    phase_seconds["fans"] = round(time.time() - started_at - phase_seconds["pairs"] - phase_seconds["blasts"], 3)
    contention: dict[str, Any] = dict(classify_contention(bandwidth_gbps, racks, aggregates, hosts=hosts, fans=fans,
                                                                queued=queued))
    contention["uplink_aggregates"] = phases
    contention["nic_fans"] = fan_record
    confidence = fit.confidence()
    confidence["pings_us"] = {str(j): {str(g): {k: [round(during, 1), round(idle, 1)] for k, (during, idle) in p.items()}
                                       for g, p in d.items()} for j, d in delays.items()}
    confidence["phase_seconds"] = phase_seconds
    return ProbeResult(hosts=hosts, latency_us=latency_us, bandwidth_gbps=bandwidth_gbps, racks=racks,
                       contention=contention, rounds=len(rounds), started_at=started_at, confidence=confidence)
