"""The simulator's event-driven flow model: every message a strategy's collectives send is a
flow that lives until its last byte arrives, whichever operation or iteration posted it.

``bench.simulate``'s iteration model prices each operation alone and ends it for every member
at once. On a link that another job loads, that is optimistic twice over (measured on the
emulated cluster, docs/simulator.md): a member whose bytes cross the loaded link leaves the
operation as soon as its last message is in the socket, and the members of the next
operation start on that link while the last one's bytes are still queued there, so
operations of consecutive iterations share it. Here each rank runs its program, the
point-to-point messages of gloo's algorithms (``programs``):

- a ring allreduce of ``n`` members sends ``2(n-1)`` chunks of ``S/n`` to the next member,
  each after receiving the previous chunk from the one before (the first at once);
- a reduce is the ring's first ``n-1`` steps, then every member's chunk to the root;
- a broadcast is a binomial tree: a member that holds the buffer sends all of it to each
  of its children at once;
- a gossip transfer is one send and one receive;
- the parameter server's push-pull sends ``S/N`` to every shard, whose server replies with
  ``S/N`` when the pushes of the worker's group have arrived (its own alone in ASP, the
  world's in a synchronous round); the worker waits for every reply.

A send never blocks (the socket takes the message); a receive blocks until the message has
arrived. Messages between two ranks go in order over one connection, one after the other;
a message of a collective moves only once the receiver has posted the receive and its notice
has reached the sender (gloo writes only into a buffer the receiver has posted), and arrives
after its bytes plus a latency, ``alpha_s`` (plus ``queue_s`` where the path crosses a link
that background streams keep full; the notice pays the same on its way back).

At every moment the connections with bytes to send share the links they cross (each NIC and
each rack uplink, each direction; capacity times ``efficiency``) by weighted max-min
fairness: a connection counts 1, each background stream ``background_weight``
(``local_weight`` at the NIC of the worker it starts on), and a connection through a link
that background streams keep full, whose round trip holds that queue, ``rtt_s / (rtt_s +
queue_s)`` of that (TCP's share falls with the round trip). The simulation jumps from event
to event (a message posted, a message through, a rank's computation done).

Every rank computes for ``compute_s`` between iterations. A rank's communication time in an
iteration is the harness's figure: from its first collective call to the return of its last.

The model costs one rate allocation per event; it is for validation-sized clusters (tens of
ranks, tens of iterations): ``python -m dssync.bench.flows --record RECORD`` replays a ``dssync
bench simcheck`` record's jobs on it (``check``).
"""

from __future__ import annotations

import functools
import heapq
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from dssync.bench.links import Network, background_streams
from dssync.patterns import Op, Pattern

__all__ = ["check", "fit_background", "fit_record", "job_rows", "measured_queue", "programs", "rank_times", "rates",
           "scenario_network"]

Action = tuple[Any, ...]


def _ring(me: int, group: Sequence[int], nbytes: float, steps: int) -> Iterator[Action]:
    n = len(group)
    i = group.index(me)
    nxt, prv = group[(i + 1) % n], group[(i - 1) % n]
    yield ("send", nxt, nbytes / n, "c")
    for k in range(steps):
        yield ("recv", prv, "c")
        if k < steps - 1:
            yield ("send", nxt, nbytes / n, "c")


def _op_program(me: int, op: Op, world_size: int) -> Iterator[Action]:
    """``me``'s messages in ``op`` (nothing where ``me`` is in none of its groups)."""
    if op.kind == "push-pull":
        others = [j for j in range(world_size) if j != me]
        group = next((tuple(g) for g in op.groups if me in g), (me,))
        yield ("pushed", group, op.nbytes / world_size)  # into its own shard, no message
        for j in others:
            yield ("send", j, op.nbytes / world_size, "push", group)
        for j in others:
            yield ("recv", j, "pull")
        return
    group = next((list(g) for g in op.groups if me in g), None)
    if group is None:
        return
    n = len(group)
    if op.kind == "send":
        for g in op.groups:
            if g[0] == me:
                yield ("send", g[1], op.nbytes, "c")
        for g in op.groups:
            if g[1] == me:
                yield ("recv", g[0], "c")
        return
    if n == 1:
        return
    if op.kind == "allreduce":
        yield from _ring(me, group, op.nbytes, 2 * (n - 1))
    elif op.kind == "reduce":
        if n > 2:
            yield from _ring(me, group, op.nbytes, n - 1)
        if me == group[0]:
            for j in group[1:]:
                yield ("recv", j, "c")
        else:
            yield ("send", group[0], op.nbytes / n, "c")
    elif op.kind == "broadcast":
        v = group.index(me)
        if v:
            yield ("recv", group[v - (1 << (v.bit_length() - 1))], "c")
        for i in range(v.bit_length(), (n - 1).bit_length()):
            if v + (1 << i) < n:
                yield ("send", group[v + (1 << i)], op.nbytes, "c")
    else:
        raise ValueError(f"the flow model cannot run a {op.kind!r} collective")


def programs(pat: Pattern, world_size: int, iterations: int, compute_s: float) -> list[Iterator[Action]]:
    """Each rank's program: per iteration, ``("start", t)``, its ops' messages, ``("end", t)``,
    then ``compute_s`` of computation."""
    def program(me: int) -> Iterator[Action]:
        for t in range(iterations):
            yield ("start", t)
            for op in pat.iteration(t):
                yield from _op_program(me, op, world_size)
            yield ("end", t)
            if compute_s > 0:
                yield ("sleep", compute_s)
    return [program(r) for r in range(world_size)]


def _links(net: Network) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per link (NIC out, NIC in per rank, then uplink out, uplink in per rack): capacity
    (bytes/s, times ``efficiency``) and the background's weight on it (streams times
    their weight), and the rack of each rank."""
    bg_nic, bg_up = background_streams(net)
    caps = net.efficiency * np.concatenate([net.nics(), net.nics(), net.uplinks(), net.uplinks()])
    racks = len(net.rack_sizes)
    background = np.concatenate([net.local_weight * bg_nic, np.zeros(net.world_size),
                                 net.background_weight * bg_up, np.zeros(racks)])
    return caps, background, net.rack_of()


def _path(net: Network, rack: np.ndarray, src: int, dst: int) -> tuple[int, ...]:
    n, racks = net.world_size, len(net.rack_sizes)
    if rack[src] == rack[dst]:
        return (src, n + dst)
    return (src, n + dst, 2 * n + int(rack[src]), 2 * n + racks + int(rack[dst]))


def rates(paths: Sequence[Sequence[int]], caps: np.ndarray, background: np.ndarray,
          weights: Sequence[float] | None = None) -> np.ndarray:
    """Weighted max-min fair rates of flows crossing ``paths`` (link indices) on links of
    ``caps``, each link also carrying greedy background of weight ``background``: raise every
    unfixed flow's rate in proportion to its weight (1 without ``weights``); the link whose
    share runs out first fixes its flows there."""
    out = np.zeros(len(paths))
    if not paths:
        return out
    w = np.ones(len(paths)) if weights is None else np.asarray(weights, dtype=float)
    left = caps.astype(float).copy()
    load = background.astype(float).copy()  # the weight still rising on each link
    unfixed = np.zeros(caps.size, dtype=int)  # flows on each link whose rate is still rising
    on: list[list[int]] = [[] for _ in range(caps.size)]
    for k, p in enumerate(paths):
        for link in p:
            on[link].append(k)
            load[link] += w[k]
            unfixed[link] += 1
    fixed = np.zeros(len(paths), dtype=bool)
    while not fixed.all():
        live = unfixed > 0
        level = np.full(caps.size, np.inf)
        level[live] = left[live] / load[live]
        link = int(np.argmin(level))
        x = float(level[link])
        for k in on[link]:
            if not fixed[k]:
                fixed[k] = True
                out[k] = w[k] * x
                for j in paths[k]:
                    left[j] -= out[k]
                    load[j] -= w[k]
                    unfixed[j] -= 1
    return out


def rank_times(net: Network, pat: Pattern, iterations: int, *, compute_s: float = 0.0) -> np.ndarray:
    """Communication seconds of each rank in each iteration, ``(iterations, world_size)``,
    when every rank runs ``pat`` with ``compute_s`` of computation between iterations."""
    n = net.world_size
    caps, background, rack = _links(net)
    busy = background > 0
    # A flow through a link that background streams keep full sees that queue in its round
    # trip, and TCP shares a link in inverse proportion to round trips: against flows with a
    # short one (inside a rack) it counts rtt / (rtt + queue) of one.
    slowed = net.rtt_s / (net.rtt_s + net.queue_s) if net.queue_s > 0 and np.isfinite(net.rtt_s) else 1.0
    background = background * slowed
    progs = programs(pat, n, iterations, compute_s)
    out = np.zeros((iterations, n))
    begun = np.zeros(n)
    # connections: (src, dst, channel) -> deque of [posted at, bytes left, bytes, delay, pushing group];
    # messages delivered, and when the receiver posted each of its receives
    queues: dict[tuple[int, int, str], deque] = {}
    delivered: dict[tuple[int, int, str], int] = {}
    expected: dict[tuple[int, int, str], int] = {}
    receives: dict[tuple[int, int, str], list[float]] = {}
    paths: dict[tuple[int, int, str], tuple[int, ...]] = {}
    waiting: dict[tuple[int, int, str], list[int]] = {}  # connection -> ranks blocked on it
    wakeups: list[tuple[float, int]] = []  # (time, rank) of ranks computing
    runnable = deque(range(n))
    now = 0.0

    pushed: dict[tuple[int, tuple[int, ...]], int] = {}  # (shard, group) -> the group's pushes in this round

    def post(src: int, dst: int, nbytes: float, channel: str, group: tuple[int, ...] = ()) -> None:
        key = (src, dst, channel)
        if key not in paths:
            paths[key] = _path(net, rack, src, dst)
            queues[key] = deque()
        queues[key].append([now, float(nbytes), float(nbytes), latency(src, dst), group])

    def answer(shard: int, group: tuple[int, ...], nbytes: float) -> None:
        """A push of ``group`` is in at ``shard``: once all of the group's are, the replies go."""
        got = pushed[shard, group] = pushed.get((shard, group), 0) + 1
        if got == len(group):
            pushed[shard, group] = 0
            for w in group:
                if w != shard:
                    post(shard, w, nbytes, "pull")

    @functools.cache
    def loaded(src: int, dst: int) -> bool:
        """Whether the path from ``src`` to ``dst`` crosses a link that background streams load."""
        return bool(busy[list(_path(net, rack, src, dst))].any())

    def latency(src: int, dst: int) -> float:
        return net.alpha_s + (net.queue_s if loaded(src, dst) else 0.0)

    def start(key: tuple[int, int, str]) -> float:
        """When the head message of ``key`` starts to move: once it is posted and, in a
        collective, once the receiver's notice that it has posted the receive has come back
        (gloo sends only into a buffer the receiver has posted; the parameter server's own
        sockets are read as bytes come), then its latency."""
        head = queues[key][0]
        if key[2] != "c":
            return head[0] + head[3]
        posted = receives.get(key, [])
        m = delivered.get(key, 0)
        return max(head[0], posted[m] + latency(key[1], key[0])) + head[3] if m < len(posted) else np.inf

    def run(r: int) -> None:
        for action in progs[r]:
            kind = action[0]
            if kind == "send":
                post(r, action[1], action[2], action[3], *action[4:])
            elif kind == "pushed":
                answer(r, action[1], action[2])
            elif kind == "recv":
                key = (action[1], r, action[2])
                expected[key] = expected.get(key, 0) + 1
                receives.setdefault(key, []).append(now)
                if delivered.get(key, 0) < expected[key]:
                    waiting.setdefault(key, []).append(r)
                    return
            elif kind == "start":
                begun[r] = now
            elif kind == "end":
                out[action[1], r] = now - begun[r]
            elif kind == "sleep":
                heapq.heappush(wakeups, (now + action[1], r))
                return

    while True:
        while runnable:
            run(runnable.popleft())
        starts = {k: start(k) for k, q in queues.items() if q}
        active = [k for k, t in starts.items() if t <= now]
        pending = [t for t in starts.values() if now < t < np.inf]
        flow = rates([paths[k] for k in active], caps, background,
                     [slowed if loaded(k[0], k[1]) else 1.0 for k in active])
        finish = [now + queues[k][0][1] / f for k, f in zip(active, flow, strict=True)]
        nxt = min(finish + pending + [w for w, _ in wakeups[:1]], default=None)
        if nxt is None:
            break
        dt = nxt - now
        now = nxt
        for k, f, end in zip(active, flow, finish, strict=True):
            head = queues[k][0]
            head[1] -= f * dt
            if end <= now * (1 + 1e-12) or head[1] <= 1e-9 * head[2]:
                queues[k].popleft()
                delivered[k] = delivered.get(k, 0) + 1
                if k[2] == "push":  # the shard's server replies once the group's pushes are in
                    answer(k[1], head[4], head[2])
                for r in waiting.pop(k, []):
                    if delivered[k] >= expected[k]:
                        runnable.append(r)
                    else:
                        waiting.setdefault(k, []).append(r)
        while wakeups and wakeups[0][0] <= now:
            runnable.append(heapq.heappop(wakeups)[1])
    if any(waiting.values()):
        raise RuntimeError(f"the flow model deadlocked: ranks {sorted({r for v in waiting.values() for r in v})} "
                           "wait for messages nobody sends")
    return out


def fit_background(samples: Sequence[dict[str, Any]], net: Network, *, queue_s: float,
                   iterations: int = 6) -> dict[str, Any]:
    """``background_weight`` for this model that fits ``samples`` (``dssync bench simcheck``'s
    contended calibration: groups allreducing back to back through another job's streams,
    ``time_s`` an iteration) best in relative error, ``net``'s latency and efficiency fitted
    already and the queue measured (``queue_s``)."""
    import dataclasses

    import scipy.optimize

    from dssync.patterns import Op

    t = np.asarray([s["time_s"] for s in samples])

    def model(weight: float) -> np.ndarray:
        trial = dataclasses.replace(net, background_weight=weight, queue_s=queue_s)
        out = []
        for s in samples:
            pat = Pattern((), ((Op("allreduce", tuple(tuple(g) for g in s["groups"]), s["bytes"]),),))
            out.append(rank_times(trial, pat, iterations)[1:].sum(axis=0).max() / (iterations - 1))
        return np.asarray(out)
    weight = float(scipy.optimize.minimize_scalar(lambda w: float(((model(w) / t - 1) ** 2).sum()),
                                                  bounds=(0.0, 4.0), method="bounded").x)
    predicted = model(weight)
    return {"background_weight": weight,
            "fit_ratio_range": [float((predicted / t).min()), float((predicted / t).max())]}


def scenario_network(scenario: str, rate_scale: float, calibration: dict[str, Any], background_weight: float, *,
                     queue_s: float, rtt_s: float) -> Network:
    """This model's network of an emulated scenario: latency, efficiency and the local weight
    from a simcheck ``calibration`` (``simcheck.refit``'s), the background's weight fitted for
    this model (``fit_background``), the queue and clear round trip measured."""
    from dssync.bench.simulate import network_of

    return network_of(scenario, rate_scale=rate_scale, alpha_s=calibration["alpha_s"],
                      efficiency=calibration["efficiency"], local_weight=calibration.get("local_weight", 1.0),
                      background_weight=background_weight, queue_s=queue_s, rtt_s=rtt_s)


def fit_record(record: dict[str, Any], *, queue_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``dssync bench simcheck`` record's calibration as the record's own model fits it
    (``simcheck.refit``), and this model's background weight fitted to its contended samples
    (``fit_background``) on ``inter-rack`` with that calibration's latency and efficiency."""
    from dssync.bench import simcheck
    from dssync.bench.simulate import network_of

    scale = record["rate_scale"]
    cal = simcheck.refit(record["calibration"], scale)
    busy = network_of("inter-rack", rate_scale=scale, alpha_s=cal["alpha_s"], efficiency=cal["efficiency"])
    return cal, fit_background(cal["contended_samples"], busy, queue_s=queue_s)


def check(record: dict[str, Any], *, queue_s: float, rtt_s: float,
          scenarios: Sequence[str] | None = None) -> dict[str, Any]:
    """This model against a ``dssync bench simcheck`` record's jobs: its latency and efficiency
    as the record's calibration fits them, the queue another job's streams keep on a link and
    the clear round trip as measured (``bench.queue_rtt``), the background's weight fitted anew
    for this model to the calibration's contended samples (``fit_background``); per scenario
    and strategy, simulated wall and per-rank comm ms per iteration and their ratios to each
    measured seed."""
    from dssync.bench.simulate import planned_rounds
    from dssync.patterns import pattern, read_spec

    scale = record["rate_scale"]
    cal, fitted = fit_record(record, queue_s=queue_s)
    compute = {r["strategy"]: r["compute_ms"] for r in record["cpu"]}
    rows = []
    for scenario in dict.fromkeys(j["scenario"] for j in record["jobs"]):
        if scenarios is not None and scenario not in scenarios:
            continue
        net = scenario_network(scenario, scale, cal, fitted["background_weight"], queue_s=queue_s, rtt_s=rtt_s)
        racks = [list(r) for r in net.topology().racks()]
        for strategy in dict.fromkeys(j["strategy"] for j in record["jobs"] if j["scenario"] == scenario):
            jobs = [j for j in record["jobs"] if j["scenario"] == scenario and j["strategy"] == strategy]
            period = planned_rounds(net) if read_spec(strategy)[0] == "ds-sync" else ()
            pat = pattern(strategy, racks, record["model_bytes"], steps=record["steps"], plan_period=period)
            ms = 1e3 * rank_times(net, pat, record["steps"], compute_s=compute[strategy] / 1e3)[record["warmup"]:]
            wall, comm = compute[strategy] + float(ms[:, 0].mean()), float(ms.mean())
            rows.append({"scenario": scenario, "strategy": strategy, "sim_wall_ms": wall, "sim_comm_ms": comm,
                         "wall_ratios": [wall / j["wall_ms"] for j in jobs],
                         "comm_ratios": [comm / j["comm_ms"] for j in jobs]})
    return {"queue_s": queue_s, "rtt_s": rtt_s, "fit": fitted, "rows": rows}


def measured_queue(path: str, rate_scale: float) -> tuple[float, float]:
    """The queue and clear round trip of a ``bench.queue_rtt`` record (seconds), which must
    have been measured at ``rate_scale``; ``ValueError`` saying what is wrong otherwise."""
    import json
    from pathlib import Path

    try:
        measured = json.loads(Path(path).read_text())
        queue_s, rtt_s, scale = float(measured["queue_s"]), float(measured["rtt_s"]), measured["rate_scale"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a queue_rtt record: {exc}") from None
    if scale != rate_scale:
        raise ValueError(f"{path} was measured at rate scale {scale}, the jobs at {rate_scale}")
    return queue_s, rtt_s


def job_rows(record: dict[str, Any], checked: dict[str, Any]) -> list[dict[str, Any]]:
    """``check``'s rows as ``bench.simcheck.predict`` gives them, one per measured job, for
    ``dssync bench simcheck --model flows``."""
    sim = {(r["scenario"], r["strategy"]): r for r in checked["rows"]}
    return [{"scenario": j["scenario"], "strategy": j["strategy"], "seed": j["seed"], "wall_ms": j["wall_ms"],
             "sim_wall_ms": s["sim_wall_ms"], "wall_ratio": s["sim_wall_ms"] / j["wall_ms"], "comm_ms": j["comm_ms"],
             "sim_comm_ms": s["sim_comm_ms"],
             "comm_ratio": s["sim_comm_ms"] / j["comm_ms"] if j["comm_ms"] > 0 else float("nan")}
            for j in record["jobs"] if (s := sim.get((j["scenario"], j["strategy"]))) is not None]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m dssync.bench.flows",
                                description="the event-driven flow model against a dssync bench simcheck record")
    p.add_argument("--record", required=True, help="a dssync bench simcheck record")
    p.add_argument("--queue-rtt", default="bench/results/queue-rtt.json",
                   help="a python -m dssync.bench.queue_rtt record, at the simcheck record's rate scale")
    p.add_argument("--rtt-ms", type=float, default=None,
                   help="the clear round trip instead of the measured one (inf: no round-trip weighting)")
    p.add_argument("--scenarios", default="", help="comma-separated (default: every scenario of the record)")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    record = json.loads(Path(args.record).read_text())
    try:
        queue_s, rtt_s = measured_queue(args.queue_rtt, record["rate_scale"])
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    rtt_s = rtt_s if args.rtt_ms is None else args.rtt_ms / 1e3
    out = check(record, queue_s=queue_s, rtt_s=rtt_s,
                scenarios=[s for s in args.scenarios.split(",") if s] or None)
    f = out["fit"]
    print(f"queue {1e3 * out['queue_s']:.1f} ms ({args.queue_rtt}) and clear round trip {1e3 * out['rtt_s']:.2f} ms; "
          f"background weight {f['background_weight']:.3f} (calibration within "
          f"{f['fit_ratio_range'][0]:.2f}-{f['fit_ratio_range'][1]:.2f})")
    for r in out["rows"]:
        w, c = r["wall_ratios"], r["comm_ratios"]
        print(f"{r['scenario']:>20} {r['strategy']:>12}: wall {r['sim_wall_ms']:7.1f} ms ÷ {min(w):.2f}-{max(w):.2f}, "
              f"comm {r['sim_comm_ms']:7.1f} ÷ {min(c):.2f}-{max(c):.2f}")
    if args.json:
        from dssync.bench.provenance import write_module_record

        write_module_record(args.json, {**out, "record": args.record, "queue_rtt": args.queue_rtt},
                            "dssync.bench.flows", argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
