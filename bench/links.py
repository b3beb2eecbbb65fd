"""The links of ``dssync simulate``'s model (``bench.simulate``): each one's capacity and the
background TCP streams on it (``Network``), and what flows that start together cost on them
(``per_flow_times``, ``host_time``, ``step_time``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dssync.topology import Topology

__all__ = ["Network"]


@dataclass(frozen=True)
class Network:
    """Capacities (bytes/s) and background TCP streams per link direction."""

    rack_sizes: tuple[int, ...]
    nic_bps: float = 125e6
    uplink_bps: float = 125e6
    alpha_s: float = 50e-6
    efficiency: float = 1.0
    """The fraction of a link's rate one of the job's flows moves when it has the link to
    itself (TCP and the collective library's framing; fitted by ``dssync bench simcheck``)."""
    background_weight: float = 1.0
    """What one background TCP stream counts for against one of the job's flows on a shared
    link, once that flow's first ``head_bytes`` are through (1: TCP's per-stream share)."""
    local_weight: float = 1.0
    """``background_weight`` for streams that start on the worker itself (``nic_out_streams``)
    at its NIC: they and the job's flow queue in the same host's qdisc, not in a switch's."""
    head_bytes: float = 0.0
    """Bytes a link shared with background streams lets the job's flows through at the
    rate they would have alone, split among the job's flows that enter it at once: a
    collective's flow finds its window open and puts it into the link's queue in one burst,
    ahead of the background's packets. Fitted by ``dssync bench simcheck``."""
    queue_s: float = 0.0
    """Seconds a flow waits in the queue that background streams keep full on a link they
    share with it (a drop-tail buffer under TCP stays full). Fitted by ``dssync bench simcheck``."""
    uplink_out_streams: dict[int, int] = field(default_factory=dict)
    """Background streams leaving rack r through its uplink."""
    nic_out_streams: dict[int, int] = field(default_factory=dict)
    """Background streams leaving worker i through its NIC (and, with ``nic_crosses``, its rack's uplink)."""
    nic_crosses_uplink: bool = True
    slow_nics: dict[int, float] = field(default_factory=dict)
    """Workers whose NIC runs below ``nic_bps``: rank -> bytes/s, each direction."""
    slow_uplinks: dict[int, float] = field(default_factory=dict)
    """Racks whose uplink runs below ``uplink_bps``: rack -> bytes/s, each direction."""
    rtt_s: float = float("inf")
    """Round trip of a path without a full queue on it (``bench.flows`` only): a flow whose path
    crosses a link that background streams keep full has ``queue_s`` more, and shares
    links with the others in inverse proportion to its round trip, as TCP does; ``inf``
    leaves every flow's weight at 1."""
    host_bps: float = float("inf")
    """Veth-bytes per second the machine hosting an emulated cluster can move (every byte
    counted once per veth it crosses: two inside a rack, four between racks); ``inf`` for a
    real cluster."""

    @property
    def world_size(self) -> int:
        return sum(self.rack_sizes)

    def nics(self) -> np.ndarray:
        """Each worker's NIC rate, bytes/s."""
        out = np.full(self.world_size, float(self.nic_bps))
        for i, bps in self.slow_nics.items():
            out[i] = bps
        return out

    def uplinks(self) -> np.ndarray:
        """Each rack's uplink rate, bytes/s."""
        out = np.full(len(self.rack_sizes), float(self.uplink_bps))
        for r, bps in self.slow_uplinks.items():
            out[r] = bps
        return out

    def rack_of(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.rack_sizes)), self.rack_sizes)

    def topology(self) -> Topology:
        return Topology.from_rack_sizes(list(self.rack_sizes))


def step_time(net: Network, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> float:
    """Seconds for one step in which flow ``k`` moves ``nbytes[k]`` from ``src[k]`` to ``dst[k]``."""
    if src.size == 0:
        return 0.0
    return net.alpha_s + max(float(per_flow_times(net, src, dst, nbytes).max()), host_time(net, src, dst, nbytes))


def host_time(net: Network, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> float:
    """Seconds the hosting machine needs to move one step's flows through its veths."""
    if not np.isfinite(net.host_bps):
        return 0.0
    racks = net.rack_of()
    crossings = np.where(racks[src] != racks[dst], 4, 2)
    # Background flows run all the time, through three veths each (their source's, the
    # uplink, the sink's), at nearly their link's rate: what they move is not the job's.
    background = len(net.uplink_out_streams) * net.uplink_bps
    background += len(net.nic_out_streams) * min(net.nic_bps, net.uplink_bps)
    capacity = max(net.host_bps - 3 * background, 0.1 * net.host_bps)
    return float((nbytes * crossings).sum()) / capacity


def per_flow_times(net: Network, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Seconds each flow takes when all of them start together: its first bytes (up to its
    share of ``head_bytes`` on a link with background streams) at the rate the job's flows
    would have alone, the rest at its share among the job's flows and the background's."""
    n, racks = net.world_size, net.rack_of()
    num_racks = len(net.rack_sizes)
    rs, rd = racks[src], racks[dst]
    cross = rs != rd
    nic_out = np.bincount(src, minlength=n).astype(float)
    nic_in = np.bincount(dst, minlength=n).astype(float)
    up_out = np.bincount(rs[cross], minlength=num_racks).astype(float)
    up_in = np.bincount(rd[cross], minlength=num_racks).astype(float)
    bg_nic, bg_up = background_streams(net)
    nics, ups = net.nics(), net.uplinks()
    rates = []  # (rate alone, rate with the background, job flows on the link) per link a flow crosses
    for bg in (0, 1):
        rate = np.minimum(_share(nics[src], nic_out[src], bg * net.local_weight * bg_nic[src]),
                          nics[dst] / nic_in[dst])
        rate[cross] = np.minimum(rate[cross], np.minimum(
            _share(ups[rs[cross]], up_out[rs[cross]], bg * net.background_weight * bg_up[rs[cross]]),
            ups[rd[cross]] / up_in[rd[cross]]))
        rates.append(net.efficiency * rate)
    alone, shared = rates
    busy = shared < alone  # flows whose slowest link carries background streams
    flows = np.where(cross & (bg_up[rs] > 0), up_out[rs], nic_out[src])  # job flows entering that link
    head = np.where(busy, np.minimum(nbytes, net.head_bytes / np.maximum(flows, 1)), 0.0)
    return np.where(busy, net.queue_s, 0.0) + head / alone + (nbytes - head) / shared


def queued_senders(net: Network) -> np.ndarray:
    """Which ranks' flows out of their rack wait in a queue that their flows inside it do
    not: their rack's uplink carries background streams, their own NIC none (there every
    flow of the rank waits alike), and the network has such a queue (``queue_s``)."""
    if net.queue_s <= 0:
        return np.zeros(net.world_size, dtype=bool)
    bg_nic, bg_up = background_streams(net)
    return (bg_up[net.rack_of()] > 0) & (bg_nic == 0)


def behind_queue(net: Network, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Which flows leave a ``queued_senders`` rank's rack (and so wait in its uplink's queue)."""
    racks = net.rack_of()
    return (racks[src] != racks[dst]) & queued_senders(net)[src]


def background_streams(net: Network) -> tuple[np.ndarray, np.ndarray]:
    """Background streams leaving each worker's NIC and each rack's uplink (a NIC's streams
    cross its rack's uplink too, with ``nic_crosses_uplink``)."""
    racks = net.rack_of()
    bg_nic, bg_up = np.zeros(net.world_size), np.zeros(len(net.rack_sizes))
    for i, k in net.nic_out_streams.items():
        bg_nic[i] += k
        if net.nic_crosses_uplink:
            bg_up[racks[i]] += k
    for r, k in net.uplink_out_streams.items():
        bg_up[r] += k
    return bg_nic, bg_up


def _share(bps: float, flows: np.ndarray | float, background: np.ndarray | float) -> np.ndarray | float:
    """One of the job's ``flows`` on a link of ``bps`` that background streams of weight
    ``background`` (their number times ``Network.background_weight`` or ``local_weight``)
    also cross."""
    return bps / (flows + background)
