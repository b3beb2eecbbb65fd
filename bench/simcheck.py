"""``dssync bench simcheck``: the simulator's prediction against the emulated cluster.

Three stages, each on real ``dssync emulate`` clusters with every rate times ``rate_scale``
(below 1, the links rather than the machine's two cores bound a step):

1. **Calibration** (``calibrate``): ``dssync bench allreduce`` on the ``static`` cluster,
   a size sweep over the world's ring, the two racks' rings at once and four cross-rack
   pairs at once. The simulator's per-message cost ``alpha_s`` and per-flow efficiency
   (the fraction of a link's rate one of the job's TCP flows moves) are fitted to those
   times by non-negative least squares on the simulator's own step model; nothing is set by
   hand.
2. **CPU share** (``cpu_times``): every strategy's job on the ``static`` cluster with its
   links unshaped (100 Gbit/s), where what is left of an iteration is the machine's work:
   forward, backward, the optimizer, copies, Python. Its wall time per iteration less its
   communication is the strategy's compute time in the model; its wall time over the
   shaped job's is the CPU share of the job (communication benchmarks are asked
   to run where the network, not the cores, bounds a step).
3. **Jobs** (``measure``): every strategy on every scenario, its background flows on, for
   each seed: a real ``dssync train`` of the ``synthetic`` task (``model_mb`` megabytes, one
   sample per rank). Measured: wall ms/iteration (rank 0's iterations after ``warmup``,
   mean) and per-rank comm ms/iteration (each rank's mean after ``warmup``, averaged).

``predict`` then runs ``dssync simulate``'s model (``bench.simulate``) for the same racks,
rates, background streams, bytes and iterations, with the calibration and compute times,
and ``ratio`` is simulated ÷ measured (1.0 is a perfect prediction; below 1 the simulator is
optimistic). The model can be re-run on a record (``predict`` on its stored measurements).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.optimize

from dssync.bench.jobs import train_on_cluster
from dssync.bench.simulate import (
    STRATEGIES,
    Network,
    network_of,
    rank_times,
    ring_round,
    with_contention,
)
from dssync.bench.tables import markdown
from dssync.launch import emulate
from dssync.topology import Topology, Worker

__all__ = ["STRATEGIES", "calibrate", "cpu_times", "fit", "markdown_table", "measure", "predict",
           "simcheck"]

#: The links of the CPU-share runs: fast enough that no step waits on them.
UNSHAPED_SCALE = 100.0


def scaled_rates(scenario: str, rate_scale: float) -> tuple[str, str]:
    """The NIC and uplink rates of ``scenario`` times ``rate_scale``, as ``dssync emulate`` takes them."""
    net = network_of(scenario, rate_scale=rate_scale)
    return emulate.format_rate(round(8 * net.nic_bps)), emulate.format_rate(round(8 * net.uplink_bps))


def _model_bytes(model_mb: float) -> int:
    from dssync.training.tasks import build_task

    model = build_task("synthetic", model_mb=model_mb).model
    return sum(p.numel() * p.element_size() for p in model.parameters())


# -- 1. calibration ----------------------------------------------------------------------------
def _calibration_groups(rack_sizes: Sequence[int]) -> dict[str, list[list[list[int]]]]:
    """The patterns the fit sees, as rounds of groups that run at once: the world's ring,
    every rack's ring, cross-rack pairs (rank ``i`` of rack 0 with rank ``i`` of rack 1,
    then with rank ``i + 1``: two rounds of the same load, so the schedule mixes), and one
    cross-rack pair alone (the first rank of each rack, as hierarchical's leaders)."""
    racks = [list(range(sum(rack_sizes[:r]), sum(rack_sizes[: r + 1]))) for r in range(len(rack_sizes))]
    a, b = racks[0], racks[1]
    k = min(len(a), len(b))
    pairs = [[[a[i], b[i]] for i in range(k)], [[a[i], b[(i + 1) % k]] for i in range(k)]]
    return {"world": [[list(range(sum(rack_sizes)))]], "racks": [racks], "pairs": pairs, "pair": [[[a[0], b[0]]]]}


def _bench_patterns(name: str, tmp: Path, rack_sizes: Sequence[int], labels: Sequence[str], *, sizes: str,
                    iters: int, timeout_s: float) -> list[dict[str, Any]]:
    """``bench allreduce`` on cluster ``name`` for each calibration pattern in ``labels``."""
    from dssync.planning.schedule import Schedule

    world = sum(rack_sizes)
    samples = []
    for label in labels:
        rounds = _calibration_groups(rack_sizes)[label]
        out = tmp / f"{label}.json"
        if label == "pairs":
            groups = tmp / "pairs-schedule.json"
            alone = [[[x] for x in range(world) if not any(x in g for g in r)] for r in rounds]
            Schedule(world, [[*r, *rest] for r, rest in zip(rounds, alone, strict=True)]).save(groups)
            where = ["--groups", str(groups)]
        elif label == "pair":  # one group, the others alone: racks of a topology made for it
            topology = tmp / "pair-topology.json"
            racks = sorted([list(rounds[0][0]), *([r] for r in range(world) if r not in rounds[0][0])], key=min)
            rack_of = {r: i for i, g in enumerate(racks) for r in g}  # racks numbered by their lowest rank
            workers = tuple(Worker(rank=r, host=f"w{r}", rack=rack_of[r]) for r in range(world))
            topology.write_text(json.dumps(Topology(workers=workers).to_dict()))
            where = ["--groups", "racks", "--topology", str(topology)]
        else:
            where = ["--groups", label, "--rack-sizes", ",".join(map(str, rack_sizes))]
        rec = emulate.run_dssync(name, ["bench", "allreduce", "--sizes", sizes, "--factor", "4", "--warmup", "3",
                                        "--iters", str(iters), *where, "--json", str(out)], out, timeout_s=timeout_s)
        samples += [{"pattern": label, "groups": rounds[0], "bytes": r["size"], "time_s": r["time_us"] * 1e-6}
                    for r in rec["rows"]]
    return samples


def calibrate(*, rate_scale: float, name: str = "simcal", sizes: str = "64K:4M", iters: int = 10,
              contended_sizes: str = "64K:1M", contended_iters: int = 5, local_sizes: str = "64K:256K",
              timeout_s: float = 900.0) -> dict[str, Any]:
    """The calibration patterns timed by ``bench allreduce``: on the ``static`` cluster for
    ``alpha_s`` and ``efficiency`` (``fit``), then the world's ring and the cross-rack pairs
    and one cross-rack pair on the ``inter-rack`` cluster with its background streams on,
    for ``background_weight``, ``head_bytes`` and ``queue_s`` (``fit_background``), and the
    world's ring and the racks' rings on the ``inter-rack+nic`` cluster, whose background
    starts on worker 4 itself, for ``local_weight`` (``fit_local``)."""
    spec = emulate.SCENARIOS["static"]
    nic, uplink = scaled_rates("static", rate_scale)
    with emulate.cluster(spec["rack_sizes"], nic=nic, uplink=uplink, name=name), \
            tempfile.TemporaryDirectory() as tmp:
        samples = _bench_patterns(name, Path(tmp), spec["rack_sizes"], ("world", "racks", "pairs"), sizes=sizes,
                                  iters=iters, timeout_s=timeout_s)
    out: dict[str, Any] = {"nic": nic, "uplink": uplink, "rack_sizes": spec["rack_sizes"], "samples": samples}
    busy = emulate.SCENARIOS["inter-rack"]
    with emulate.cluster(busy["rack_sizes"], nic=nic, uplink=uplink, name=name), \
            tempfile.TemporaryDirectory() as tmp:
        emulate.contend(name=name, flows=busy["flows"])
        contended = _bench_patterns(name, Path(tmp), busy["rack_sizes"], ("world", "pairs", "pair"), sizes=contended_sizes,
                                    iters=contended_iters, timeout_s=timeout_s)
    out["contended_samples"] = contended
    local = emulate.SCENARIOS["inter-rack+nic"]
    with emulate.cluster(local["rack_sizes"], nic=nic, uplink=uplink, name=name), \
            tempfile.TemporaryDirectory() as tmp:
        emulate.contend(name=name, flows=local["flows"])
        out["local_samples"] = _bench_patterns(name, Path(tmp), local["rack_sizes"], ("world", "racks"),
                                               sizes=local_sizes, iters=contended_iters, timeout_s=timeout_s)
    return refit(out, rate_scale)


def refit(calibration: dict[str, Any], rate_scale: float) -> dict[str, Any]:
    """``calibration`` with the model's parameters fitted anew to its samples (``fit``, then
    ``fit_background`` on the contended ones)."""
    out = {k: v for k, v in calibration.items() if k.endswith("samples") or k in ("nic", "uplink", "rack_sizes")}
    out.update(fit(out["samples"], network_of("static", rate_scale=rate_scale)))
    busy = network_of("inter-rack", alpha_s=out["alpha_s"], efficiency=out["efficiency"], rate_scale=rate_scale)
    out.update(fit_background(out["contended_samples"], busy))
    if "local_samples" in out:
        local = network_of("inter-rack+nic", rate_scale=rate_scale,
                           **{k: v for k, v in out.items() if k in FITTED})
        out.update(fit_local(out["local_samples"], local))
    return out


def fit_local(samples: Sequence[dict[str, Any]], net: Network) -> dict[str, Any]:
    """``local_weight`` that fits ``samples``, timed with background streams starting on a
    worker, best in relative error, the rest of ``net`` fitted already (bounded scalar search)."""
    t = np.asarray([s["time_s"] for s in samples])

    def model(weight: float) -> np.ndarray:
        trial = dataclasses.replace(net, local_weight=weight)
        return np.asarray([ring_round(trial, s["groups"], s["bytes"]) for s in samples])
    weight = float(scipy.optimize.minimize_scalar(lambda w: float(((model(w) / t - 1) ** 2).sum()),
                                                  bounds=(0.0, 50.0), method="bounded").x)
    predicted = model(weight)
    return {"local_weight": weight, "local_fit_ratio_range": [float((predicted / t).min()), float((predicted / t).max())]}


def fit(samples: Sequence[dict[str, Any]], net: Network) -> dict[str, Any]:
    """``alpha_s`` and ``efficiency`` such that ``time = steps * alpha + bytes_time / efficiency``
    fits ``samples`` best (non-negative least squares, relative errors), where ``steps`` and
    ``bytes_time`` are the simulator's ring of each sample's groups on ``net``."""
    bare = Network(net.rack_sizes, nic_bps=net.nic_bps, uplink_bps=net.uplink_bps, alpha_s=0.0)
    a = np.asarray([[2 * (max(len(g) for g in s["groups"]) - 1), ring_round(bare, s["groups"], s["bytes"])]
                    for s in samples])
    t = np.asarray([s["time_s"] for s in samples])
    (alpha, inv_eff), _ = scipy.optimize.nnls(a / t[:, None], np.ones_like(t))
    predicted = a @ np.array([alpha, inv_eff])
    return {"alpha_s": float(alpha), "efficiency": float(1 / inv_eff) if inv_eff > 0 else float("inf"),
            "fit_ratio_range": [float((predicted / t).min()), float((predicted / t).max())]}


def fit_background(samples: Sequence[dict[str, Any]], net: Network) -> dict[str, Any]:
    """``background_weight``, ``head_bytes`` and ``queue_s`` (``bench.simulate.Network``) that
    fit the ``samples`` timed with background streams on ``net`` (whose latency and
    efficiency are already fitted) best in relative error (bounded least squares)."""
    t = np.asarray([s["time_s"] for s in samples])

    def model(x: np.ndarray) -> np.ndarray:
        trial = dataclasses.replace(net, background_weight=float(x[0]), head_bytes=float(x[1]) * 1e6,
                                    queue_s=float(x[2]) * 1e-3)
        return np.asarray([ring_round(trial, s["groups"], s["bytes"]) for s in samples])
    x = scipy.optimize.least_squares(lambda x: model(x) / t - 1, x0=[1.0, 0.05, 1.0],
                                     bounds=([0.0, 0.0, 0.0], [4.0, 8.0, 1000.0])).x
    predicted = model(x)
    return {"background_weight": float(x[0]), "head_bytes": float(x[1]) * 1e6, "queue_s": float(x[2]) * 1e-3,
            "background_fit_ratio_range": [float((predicted / t).min()), float((predicted / t).max())]}


# -- 2. and 3. jobs ----------------------------------------------------------------------------
def _job(name: str, tmp: Path, scenario: str, strategy: str, *, seed: int, model_mb: float, steps: int,
         warmup: int, timeout_s: float, topo: Path) -> dict[str, Any]:
    from dssync.strategies import get_strategy
    from dssync.training.loop import TrainConfig

    spec = emulate.SCENARIOS[scenario]
    # a strategy that plans around the network gets the probed topology, the others the racks
    topology = Topology.load(topo) if get_strategy(strategy).probes else Topology.from_rack_sizes(spec["rack_sizes"])
    config = TrainConfig(strategy=strategy, task="synthetic", model_mb=model_mb, seed=seed, batch_size=1, steps=steps,
                         eval_every=steps, topology=topology, probe_first=True)
    rec = train_on_cluster(name, config, tmp / f"{strategy}-{seed}.json", timeout_s=timeout_s)
    by_rank = rec["comm_ms_by_rank"]
    return {"scenario": scenario, "strategy": strategy, "seed": seed, "steps": steps, "warmup": warmup,
            "wall_ms": statistics.fmean(rec["wall_ms_samples"][warmup:]),
            "comm_ms": statistics.fmean(statistics.fmean(mine[warmup:]) for mine in by_rank),
            "rank0_comm_ms": statistics.fmean(by_rank[0][warmup:]),
            "wall_ms_samples": rec["wall_ms_samples"], "comm_ms_by_rank": by_rank}


def _topology_file(tmp: Path, scenario: str) -> Path:
    topo = tmp / f"topology-{scenario}.json"
    topo.write_text(json.dumps(with_contention(network_of(scenario)).to_dict()))
    return topo


def cpu_times(strategies: Sequence[str], *, model_mb: float, steps: int, warmup: int, name: str = "simcpu",
              timeout_s: float = 900.0, progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Each strategy's job on the unshaped ``static`` cluster (stage 2)."""
    spec = emulate.SCENARIOS["static"]
    nic, uplink = scaled_rates("static", UNSHAPED_SCALE)
    rows = []
    with emulate.cluster(spec["rack_sizes"], nic=nic, uplink=uplink, name=name), \
            tempfile.TemporaryDirectory() as tmp:
        topo = _topology_file(Path(tmp), "static")
        for strategy in strategies:
            row = _job(name, Path(tmp), "static", strategy, seed=0, model_mb=model_mb, steps=steps, warmup=warmup,
                       timeout_s=timeout_s, topo=topo)
            row["compute_ms"] = max(row["wall_ms"] - row["rank0_comm_ms"], 0.0)
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows


def measure(scenarios: Sequence[str], strategies: Sequence[str], *, seeds: Sequence[int], model_mb: float,
            steps: int, warmup: int, rate_scale: float, name: str = "simchk", timeout_s: float = 900.0,
            progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every strategy on every scenario's shaped cluster, background flows on, seed by seed
    (stage 3)."""
    rows = []
    for scenario in scenarios:
        spec = emulate.SCENARIOS[scenario]
        nic, uplink = scaled_rates(scenario, rate_scale)
        with emulate.cluster(spec["rack_sizes"], nic=nic, uplink=uplink, name=name), \
                tempfile.TemporaryDirectory() as tmp:
            topo = _topology_file(Path(tmp), scenario)
            emulate.contend_scenario(spec, name=name, rate_scale=rate_scale)
            for seed in seeds:
                for strategy in strategies:
                    restarted = 0
                    for _attempt in range(3):  # a job during which a background flow ended is run again
                        row = _job(name, Path(tmp), scenario, strategy, seed=seed, model_mb=model_mb, steps=steps,
                                   warmup=warmup, timeout_s=timeout_s, topo=topo)
                        dead = emulate.dead_flows(name)
                        if not dead:
                            break
                        emulate.contend(name=name, clear=True)
                        emulate.contend_scenario(spec, name=name, rate_scale=rate_scale)
                        restarted += 1
                    else:
                        raise emulate.EmulationError(f"background flows {', '.join(dead)} ended during three "
                                                     f"runs of {strategy} on {scenario}")
                    row.update(nic=nic, uplink=uplink, rate_scale=rate_scale, background_restarted=restarted)
                    rows.append(row)
                    if progress is not None:
                        progress(row)
    return rows


# -- the model beside the measurements ----------------------------------------------------------
#: The model's parameters that a calibration fits, and their values without one.
FITTED = {"alpha_s": 0.0, "efficiency": 1.0, "background_weight": 1.0, "local_weight": 1.0, "head_bytes": 0.0,
          "queue_s": 0.0}


def _fitted(calibration: dict[str, Any]) -> dict[str, float]:
    return {k: float(calibration.get(k, default)) for k, default in FITTED.items()}


def predict(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Simulated ÷ measured per (scenario, strategy, seed) of a simcheck ``record``: the
    model fitted to the record's calibration samples (``refit``, which updates
    ``record["calibration"]``), each strategy's compute time from the CPU-share runs, the
    same racks, rates, streams, bytes and iteration window."""
    size, rate_scale = record["model_bytes"], record["rate_scale"]
    cal = record["calibration"] = refit(record["calibration"], rate_scale)
    compute = {r["strategy"]: r["compute_ms"] for r in record["cpu"]}
    cache: dict[tuple[str, str], tuple[float, float]] = {}
    out = []
    for m in record["jobs"]:
        key = (m["scenario"], m["strategy"])
        if key not in cache:
            net = network_of(m["scenario"], rate_scale=rate_scale, **_fitted(cal))
            ranks = 1e3 * rank_times(net, m["strategy"], size, m["steps"])[m["warmup"]:]
            cache[key] = (compute[m["strategy"]] + float(ranks[:, 0].mean()), float(ranks.mean()))
        wall, comm = cache[key]
        out.append({"scenario": m["scenario"], "strategy": m["strategy"], "seed": m["seed"],
                    "wall_ms": m["wall_ms"], "sim_wall_ms": wall, "wall_ratio": wall / m["wall_ms"],
                    "comm_ms": m["comm_ms"], "sim_comm_ms": comm,
                    "comm_ratio": comm / m["comm_ms"] if m["comm_ms"] > 0 else float("nan")})
    return out


def simcheck(scenarios: Sequence[str], strategies: Sequence[str], *, seeds: Sequence[int] = (0, 1, 2),
             model_mb: float = 1.0, steps: int = 20, warmup: int = 4, rate_scale: float = 0.05,
             name: str = "simchk", timeout_s: float = 900.0,
             progress: Callable[[str, dict[str, Any]], None] | None = None,
             save: Callable[[dict[str, Any]], None] | None = None,
             calibrated: dict[str, Any] | None = None) -> dict[str, Any]:
    """All three stages and the prediction: the record ``dssync bench simcheck`` writes.
    ``save`` gets the record as it grows, after every stage and every job. ``calibrated``:
    a simcheck record at the same rate scale, model size and iteration window whose
    calibration and CPU-share rows this one takes instead of measuring its own (stage 3 only)."""
    unknown = [s for s in scenarios if s not in emulate.SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}; choose from {', '.join(emulate.SCENARIOS)}")
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        raise ValueError(f"the simulator has no model of {bad[0]!r}; choose from {', '.join(STRATEGIES)}")
    if steps <= warmup or warmup < 0 or model_mb <= 0 or not rate_scale > 0:
        raise ValueError(f"need steps > warmup >= 0, model_mb > 0 and rate_scale > 0, got {steps}, {warmup}, "
                         f"{model_mb}, {rate_scale}")
    say = progress or (lambda stage, row: None)
    keep = save or (lambda record: None)
    record: dict[str, Any] = {"model_mb": model_mb, "model_bytes": _model_bytes(model_mb), "steps": steps,
                              "warmup": warmup, "rate_scale": rate_scale, "seeds": list(seeds)}
    if calibrated is not None:
        same = {k: calibrated.get(k) for k in ("rate_scale", "model_mb", "steps", "warmup")}
        if same != {k: record[k] for k in same}:
            raise ValueError(f"the calibrated record was measured at {same}, this run is at "
                             f"{ {k: record[k] for k in same} }")
        missing = sorted(set(strategies) - {r["strategy"] for r in calibrated["cpu"]})
        if missing:
            raise ValueError(f"the calibrated record has no CPU-share row of {', '.join(missing)}")
        record["calibration"] = calibrated["calibration"]
        record["cpu"], record["jobs"] = [r for r in calibrated["cpu"] if r["strategy"] in strategies], []
    else:
        record["calibration"] = calibrate(rate_scale=rate_scale, name=f"{name}c", timeout_s=timeout_s)
        record["cpu"], record["jobs"] = [], []
    say("calibration", record["calibration"])

    def add(stage: str, row: dict[str, Any]) -> None:
        record[stage].append(row)
        keep(record)
        say(stage, row)
    keep(record)
    if calibrated is None:
        cpu_times(strategies, model_mb=model_mb, steps=steps, warmup=warmup, name=f"{name}u", timeout_s=timeout_s,
                  progress=lambda r: add("cpu", r))
    measure(scenarios, strategies, seeds=seeds, model_mb=model_mb, steps=steps, warmup=warmup,
            rate_scale=rate_scale, name=name, timeout_s=timeout_s, progress=lambda r: add("jobs", r))
    static = {(r["strategy"]): r["wall_ms"] for r in record["jobs"] if r["scenario"] == "static" and r["seed"] == seeds[0]}
    for r in record["cpu"]:
        if r["strategy"] in static:
            r["cpu_share"] = r["wall_ms"] / static[r["strategy"]]
    record["rows"] = predict(record)
    return record


def markdown_table(record: dict[str, Any]) -> str:
    """Per (scenario, strategy): measured means over the seeds and the range of simulated ÷
    measured over the seeds, wall and per-rank comm."""
    rows = []
    keys = list(dict.fromkeys((r["scenario"], r["strategy"]) for r in record["rows"]))
    for key in keys:
        rs = [r for r in record["rows"] if (r["scenario"], r["strategy"]) == key]

        def span(field: str, rs: list[dict[str, Any]] = rs) -> str:
            vals = [r[field] for r in rs]
            return f"{min(vals):.2f}–{max(vals):.2f}" if len(vals) > 1 else f"{vals[0]:.2f}"
        rows.append([key[0], key[1], f"{statistics.fmean(r['wall_ms'] for r in rs):.1f}", f"{rs[0]['sim_wall_ms']:.1f}",
                     span("wall_ratio"), f"{statistics.fmean(r['comm_ms'] for r in rs):.1f}",
                     f"{rs[0]['sim_comm_ms']:.1f}", span("comm_ratio")])
    return markdown(["scenario", "strategy", "wall ms/iter measured", "simulated", "÷ (seeds)",
                     "per-rank comm ms/iter measured", "simulated", "÷ (seeds)"], rows)
