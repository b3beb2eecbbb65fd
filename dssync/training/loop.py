"""The training loop every strategy runs in, and its measurements (time to accuracy, communication per iteration).

``train(config)`` runs ``config.strategy`` on every rank (local ranks it spawns, or this
rank under a launcher) and returns rank 0's result: the ``train --json`` record.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
import time
import typing
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, get_type_hints

import torch
import torch.nn.functional as F

from dssync._text import read_settings
from dssync.averaging.flat import hookless_copy
from dssync.collectives import Communicator
from dssync.errors import BackendUnavailableError, DssyncError, ScheduleError, TopologyError
from dssync.launch import from_environ, run_ranks
from dssync.launch.spawn import BACKENDS
from dssync.planning.schedule import Schedule
from dssync.probing.probe import probe_across_hosts
from dssync.strategies import REGISTRY, get_strategy
from dssync.strategies.base import Strategy, StrategyContext
from dssync.topology import Topology
from dssync.topology.prior import parse_racks_from
from dssync.training import checkpoint as ckpt
from dssync.training.tasks import TASKS, build_task

__all__ = ["LR_SCHEDULES", "OPTIMIZERS", "make_optimizer", "TrainConfig", "at_target", "first_at_target", "lr_factor", "per_rank_comm_ms", "summarize_comm",
           "train", "train_rank"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    strategy: str
    task: str = "digits"
    steps: int = 300
    seed: int = 0
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    """SGD's momentum (``optimizer`` sgd)."""
    optimizer: str = "sgd"
    """The loop's optimizer, ``sgd`` (``torch.optim.SGD`` with ``momentum``) or ``adamw``
    (``torch.optim.AdamW``, torch's default betas): each rank steps it on its own gradients
    (or, with a gradient-averaging strategy, the averaged ones)."""
    weight_decay: float = 0.0
    eval_every: int = 25
    """Evaluate the model the strategy would hand back every this many steps (rank 0)."""
    model_mb: float = 1.0
    """Model size for the ``synthetic`` task, in megabytes of float32 parameters."""
    num_racks: int = 2
    """Racks of the logical topology used when ``topology`` is not given."""
    probe_first: bool = False
    """Without ``topology``, ds-sync probes the network first when its ranks run on more
    than one host (on one host a probe measures the CPU, and ``num_racks`` applies)."""
    racks_from: str | None = None
    """When ds-sync probes: racks the user knows (``slurm`` or ``hostnames:REGEX``), a prior
    the measurement checks (``dssync.topology.prior``)."""
    topology: Topology | None = None
    schedule: Schedule | None = None
    strategy_options: dict[str, Any] = field(default_factory=dict)
    """The strategy's settings by name, as its ``Config`` takes them (checked when this config is made)."""
    strategy_config: Strategy.Config = field(init=False, repr=False, compare=False)
    """``strategy_options`` as the strategy's own frozen ``Config``, built and validated once,
    here; every rank builds its strategy from this object."""
    lr_schedule: str = "constant"
    """``constant`` or ``cosine`` (to zero at ``steps``), after ``warmup_steps``: see ``lr_factor``."""
    warmup_steps: int = 0
    """Linear warm-up of the learning rate over the first this many iterations (Goyal et al.'s
    gradual warm-up for a large overall batch, which the DS-Sync paper's evaluation uses)."""
    target_accuracy: float | None = None
    """Stop once the handed-back model reaches this test accuracy at an evaluation (time to
    accuracy, the README's headline measure); ``steps`` is then the cap. Strategies whose mid-run snapshots
    stop no worker (asp, ssp, specsync) evaluate after the loop and run to the cap."""
    timeout_s: float = 300.0
    progress: bool = False
    backend: str = "torch"
    """Collective library: ``torch`` (torch.distributed), ``mpi`` (mpi4py) or ``horovod``."""
    device: str = "cpu"
    """``cpu``, or ``cuda``: each rank's model and data on its local GPU (``LOCAL_RANK`` under a
    launcher, the rank among spawned ones), CUDA tensors through NCCL."""
    checkpoint: str | None = None
    """A folder for checkpoints (``dssync.training.checkpoint``): the run resumes from the latest one in
    it, if any, and writes one every ``checkpoint_every`` iterations and at its end."""
    checkpoint_every: int = 0
    stop_after: int | None = None
    """Stop after this iteration, as a preemption would, leaving a checkpoint to resume from;
    ``steps`` still sets the run's length (learning-rate schedule, SWA start)."""

    def __post_init__(self) -> None:
        # unknown names and bad settings fail here, before any process starts
        config = get_strategy(self.strategy).Config
        unknown = sorted(set(self.strategy_options) - config.settings())
        if unknown:
            raise ValueError(f"{self.strategy} has no setting {', '.join(unknown)}; its settings: "
                             f"{', '.join(sorted(config.settings())) or 'none'}")
        object.__setattr__(self, "strategy_config", config(**self.strategy_options))
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose from {', '.join(BACKENDS)}")
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of: {', '.join(sorted(TASKS))}")
        for name in ("steps", "batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0 or self.lr == float("inf"):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
        if not 0 <= self.weight_decay < 1:
            raise ValueError(f"weight_decay must be in [0, 1), got {self.weight_decay}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; choose from {', '.join(LR_SCHEDULES)}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps), got {self.warmup_steps} of {self.steps}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"target_accuracy must be in (0, 1], got {self.target_accuracy}")
        if self.model_mb <= 0:
            raise ValueError(f"model size must be positive, got {self.model_mb} MB")
        if not 0 < self.timeout_s < 1e9:  # also refuses nan
            raise ValueError(f"timeout_s must be a positive number of seconds, got {self.timeout_s}")
        if self.num_racks < 1:
            raise ValueError(f"num_racks must be 1 or more, got {self.num_racks}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.device == "cuda":
            cls = get_strategy(self.strategy)
            if "cuda" not in cls.devices:
                able = sorted(n for n, c in REGISTRY.items() if "cuda" in c.devices)
                raise ValueError(f"{self.strategy} keeps its model on the CPU (its parameter server moves "
                                 f"bytes through sockets); strategies that train on a GPU: {', '.join(able)}")
            if self.backend != "torch":
                raise ValueError("--device cuda runs on torch.distributed (NCCL); use --backend torch")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be 0 (only at the end) or more, got {self.checkpoint_every}")
        if self.stop_after is not None and not 1 <= self.stop_after <= self.steps:
            raise ValueError(f"stop_after must be in 1..steps ({self.steps}), got {self.stop_after}")
        if (self.checkpoint_every or self.stop_after is not None) and self.checkpoint is None:
            raise ValueError("checkpoint_every and stop_after need a checkpoint folder")
        if self.checkpoint is not None and not get_strategy(self.strategy).resumable:
            resumable = sorted(n for n, c in REGISTRY.items() if c.resumable)
            raise ValueError(f"{self.strategy} cannot be checkpointed yet (its state between iterations is not "
                             f"saved); strategies that can: {', '.join(resumable)}")


    @classmethod
    def read(cls, pairs: Sequence[str], owner: str = "a job") -> dict[str, Any]:
        """``["lr=0.1", "--weight-decay=0.01", ...]``: settings of this config (a field each, its
        name as ``dssync train``'s option or as the field), each read as its field's type."""
        return read_settings(cls, pairs, owner, flag="setting", form="--OPTION=VALUE")

    #: ``to_dict``'s format; ``from_dict`` refuses any other.
    VERSION: ClassVar[int] = 1

    def to_dict(self) -> dict[str, Any]:
        """This config as JSON holds it: every setting, the topology and schedule in their file
        formats (``from_dict`` reads it back; ``dssync train --config`` takes it)."""
        out: dict[str, Any] = {"version": self.VERSION}
        for f in fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if f.name in ("topology", "schedule") and value is not None:
                value = value.to_dict()
            elif f.name == "strategy_options":
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "job config") -> TrainConfig:
        """The config ``to_dict`` wrote. Every value must have its field's type; an unknown or
        missing key, a wrong type or a bad setting is a ``ValueError`` naming it."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: a job config is a JSON object, got {type(data).__name__}")
        if data.get("version") != cls.VERSION:
            raise ValueError(f'{source}: "version" must be {cls.VERSION}, got {data.get("version")!r}')
        hints = get_type_hints(cls)
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(data) - known - {"version"})
        if unknown:
            raise ValueError(f"{source}: unknown settings {unknown}; a job config holds {sorted(known)}")
        if "strategy" not in data:
            raise ValueError(f'{source}: "strategy" is missing')
        kwargs: dict[str, Any] = {}
        for name in set(data) & known:
            value = data[name]
            if name == "topology" and value is not None:
                value = Topology.from_dict(_object(value, name, source), source=f"{source}: topology")
            elif name == "schedule" and value is not None:
                value = Schedule.from_dict(_object(value, name, source), source=f"{source}: schedule")
            elif name == "strategy_options":
                value = dict(_object(value, name, source))
                strategy = data["strategy"]
                options = get_type_hints(get_strategy(strategy).Config) if strategy in REGISTRY else {}
                for key, setting in value.items():
                    if key in options and not _has_type(setting, options[key]):
                        raise ValueError(f"{source}: {strategy}'s {key} must be {_type_name(options[key])}, "
                                         f"got {setting!r}")
                    if key in options and options[key] is float:
                        value[key] = float(setting)
            elif not _has_type(value, hints[name]):
                raise ValueError(f"{source}: {name} must be {_type_name(hints[name])}, got {value!r}")
            kwargs[name] = float(value) if hints[name] in (float, float | None) and value is not None else value
        return cls(**kwargs)


def _object(value: Any, name: str, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{source}: {name} must be a JSON object, got {value!r}")
    return value


def _type_name(hint: Any) -> str:
    """``int``, ``float | None``: a field's type as the user reads it."""
    return getattr(hint, "__name__", None) or str(hint)


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a plain field type (``int``, ``float``, ``str``, ``bool``, or
    one of them or ``None``); a JSON integer is a float too, a bool is neither."""
    kinds = set(typing.get_args(hint)) or {hint}
    if value is None:
        return type(None) in kinds
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int):
        return bool({int, float} & kinds)
    return any(isinstance(value, k) for k in kinds if isinstance(k, type) and k is not type(None))


LR_SCHEDULES = ("constant", "cosine")
OPTIMIZERS = ("sgd", "adamw")


def make_optimizer(cfg: TrainConfig, params: Any) -> torch.optim.Optimizer:
    """The loop's optimizer over ``params``, as ``cfg`` sets it."""
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def lr_factor(step: int, *, steps: int, schedule: str = "constant", warmup_steps: int = 0) -> float:
    """The learning rate of iteration ``step`` as a fraction of the configured one: linear
    warm-up from ``1 / warmup_steps`` to 1 over the first ``warmup_steps`` iterations, then
    constant, or a half cosine from 1 to 0 at ``steps`` (``torch.optim.lr_scheduler.LambdaLR``
    applies it)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, steps - warmup_steps))))


def comm_warmup(steps: int) -> int:
    """Iterations left out of the comm figures at the start of a run of ``steps``."""
    return min(10, steps // 10)


def summarize_comm(samples_by_rank: list[list[float]], *, warmup: int) -> tuple[float, list[float]]:
    """Median over iterations after ``warmup`` of the per-iteration maximum over ranks (ms)."""
    per_iter = [max(s) * 1e3 for s in zip(*samples_by_rank, strict=True)]
    kept = per_iter[warmup:] or per_iter
    return (statistics.median(kept) if kept else 0.0), per_iter


def at_target(point: dict[str, Any], target: float) -> bool:
    """Whether an evaluation's accuracy reaches ``target`` (a target read back from JSON may
    differ from the accuracy it came from in the last bit)."""
    return point["accuracy"] >= target - 1e-12


def first_at_target(curve: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation of ``curve`` that reaches ``target`` (``at_target``), or ``None``."""
    return next((p for p in curve if at_target(p, target)), None)


def per_rank_comm_ms(samples_by_rank: list[list[float]], *, warmup: int) -> float:
    """The headline communication figure: each rank's own mean comm time per iteration after
    ``warmup`` (seconds in, ms out), averaged over the ranks.

    The per-iteration maximum over ranks (``summarize_comm``) charges protocols whose groups
    run out of step (ds-sync, gossip) for a wait that a different rank pays each iteration, so
    the maxima add up to more than the run's wall time; this is what a rank actually spends."""
    means = [statistics.fmean(mine[warmup:] or mine) for mine in samples_by_rank if mine]
    return 1e3 * statistics.fmean(means) if means else 0.0


def train_rank(comm: Communicator, cfg: TrainConfig) -> dict[str, Any] | None:
    """One rank's training run; rank 0 returns the record, the others ``None``."""
    rank, world_size = comm.rank, comm.world_size
    topology = cfg.topology or _probed(comm, cfg) or Topology.even(world_size, min(cfg.num_racks, world_size))
    if topology.world_size != world_size:
        raise TopologyError(
            f"the topology has {topology.world_size} workers but the job has {world_size} ranks; "
            f"use --nproc {topology.world_size} or a topology for {world_size} ranks"
        )
    task = build_task(cfg.task, seed=cfg.seed, model_mb=cfg.model_mb)
    if cfg.device == "cuda":
        task.to(_local_gpu(comm))
    model = task.model
    cls = get_strategy(cfg.strategy)
    strategy = cls(
        StrategyContext(comm=comm, model=model, topology=topology, schedule=cfg.schedule, steps=cfg.steps),
        cfg.strategy_config,
    )
    base = make_optimizer(cfg, model.parameters())
    optimizer = strategy.wrap_optimizer(base)  # before the scheduler: strategies read the set rate
    scheduler = torch.optim.lr_scheduler.LambdaLR(base, functools.partial(
        lr_factor, steps=cfg.steps, schedule=cfg.lr_schedule, warmup_steps=cfg.warmup_steps))
    first = _resume(comm, cfg, model, base, scheduler, strategy)
    strategy.setup()
    net = strategy.training_module()
    batches = task.batches(rank, world_size, cfg.batch_size, cfg.seed, start=first)
    # With a target, rank 0 evaluates at once and every rank learns whether to stop; a strategy
    # whose snapshots stop no worker would train on during that evaluation, so it does not.
    inline = cfg.target_accuracy is not None and strategy.snapshot_is_collective()

    progress = _progress(cfg, world_size) if cfg.progress and rank == 0 else None
    snapshots: list[tuple[dict[str, Any], torch.nn.Module]] = []
    curve: list[dict[str, Any]] = []
    eval_s = 0.0
    steps_run = cfg.steps
    saved = first
    ends: list[float] = []  # rank 0's clock at the end of each iteration, evaluation excluded
    comm.barrier()
    start = time.perf_counter()
    for step in range(first, cfg.steps):
        x, y = next(batches)

        def forward_backward(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            return loss

        strategy.compute(step, forward_backward)
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
        with warnings.catch_warnings():  # strategies that step elsewhere never call base.step()
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)`")
            scheduler.step()
        ends.append(time.perf_counter() - start - eval_s)
        if progress is not None:
            progress[0].update(progress[1], advance=1)
        stopping = step + 1 == cfg.stop_after
        if cfg.checkpoint is not None and (stopping or cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0):
            saved = _save(comm, cfg, step + 1, model, base, scheduler, strategy)
        if (step + 1) % cfg.eval_every and step + 1 != cfg.steps and not stopping:
            continue
        t0 = time.perf_counter()
        last = step + 1 == cfg.steps
        handed_back = strategy.final_model() if last else strategy.snapshot()  # collective for some
        stop = False
        if rank == 0:
            point: dict[str, Any] = {"step": step + 1, "wall_s": t0 - start - eval_s}
            updates = strategy.global_updates()
            if updates is not None:
                point["updates"] = updates
            if inline:
                point["accuracy"], point["loss"] = task.evaluate(handed_back)
                curve.append(point)
                stop = at_target(point, cfg.target_accuracy)
            else:  # evaluated after the loop: rank 0 stops only for the copy
                snapshots.append((point, hookless_copy(handed_back)))
        if inline and not last:
            flag = torch.tensor([float(stop)])
            comm.broadcast_(flag, src=0)
            stop = bool(flag.item())
        eval_s += time.perf_counter() - t0
        if stop or stopping:
            steps_run = step + 1
            break
    wall_s = time.perf_counter() - start - eval_s
    if cfg.checkpoint is not None and saved != steps_run:
        _save(comm, cfg, steps_run, model, base, scheduler, strategy)
    if progress is not None:
        progress[0].stop()

    strategy.close()
    samples = comm.allgather_object(strategy.comm_s)
    stats = comm.allgather_object(strategy.stats())
    if rank != 0:
        return None
    for point, snapshot in snapshots:
        point["accuracy"], point["loss"] = task.evaluate(snapshot)
        curve.append(point)
    warmup = comm_warmup(steps_run - first)
    comm_ms, per_iter = summarize_comm(samples, warmup=warmup)
    reached = None if cfg.target_accuracy is None else first_at_target(curve, cfg.target_accuracy)
    changes = strategy.schedule_changes()
    # Comm time under each schedule the run followed: the median of the per-iteration
    # maxima over the iterations it was in force (the first few after a switch included).
    edges = [max(c["step"], first) for c in changes] + [steps_run]
    per_schedule = [{"from_step": a, "to_step": b, "comm_ms_per_iter": statistics.median(per_iter[a - first:b - first])}
                    for a, b in zip(edges, edges[1:], strict=False) if b > a]
    return {
        "strategy": cfg.strategy,
        "backend": cfg.backend,
        "task": cfg.task,
        "world_size": world_size,
        "steps": cfg.steps,
        "steps_run": steps_run,
        "resumed_from": first,
        "final_accuracy": curve[-1]["accuracy"],
        "best_accuracy": max(c["accuracy"] for c in curve),
        "wall_s": wall_s,
        "wall_ms_per_iter": 1e3 * wall_s / (steps_run - first),
        "per_rank_comm_ms_per_iter": per_rank_comm_ms(samples, warmup=warmup),
        "comm_ms_per_iter": comm_ms,
        "target_accuracy": cfg.target_accuracy,
        "time_to_target_s": None if reached is None else reached["wall_s"],
        "iterations_to_target": None if reached is None else reached["step"],
        "schedule_changes": changes,
        "topology": {"racks": topology.racks(), "probe": None if topology.probe is None else dict(topology.probe),
                     "confidence": None if topology.confidence is None else dict(topology.confidence),
                     "contention": {
            k: v for k, v in dict(topology.contention).items() if k in ("uplinks", "nics")}},
        "comm_ms_by_schedule": per_schedule,
        "curve": curve,
        "comm_ms_samples": per_iter,
        "wall_ms_samples": [round(1e3 * (b - a), 3) for a, b in zip([0.0, *ends], ends, strict=False)],
        "comm_ms_by_rank": [[round(1e3 * x, 3) for x in mine] for mine in samples],
        "strategy_stats": stats,
        "config": {k: v for k, v in asdict(cfg).items()
                   if k not in ("topology", "schedule", "progress", "strategy_config")},
    }


def _local_gpu(comm: Communicator) -> torch.device:
    """This rank's GPU (``init_process_group`` has made it the current device)."""
    if not torch.cuda.is_available():
        raise BackendUnavailableError(f"rank {comm.rank}: --device cuda, but torch sees no CUDA GPU on this host "
                            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})")
    return torch.device("cuda", torch.cuda.current_device())


def _settings(cfg: TrainConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in ckpt.KEPT}


def _save(comm: Communicator, cfg: TrainConfig, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          scheduler: Any, strategy: Any) -> int:
    """Checkpoint every rank after iteration ``step`` (collective); returns ``step``."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "strategy": strategy.state_dict(), "rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state() if cfg.device == "cuda" else None}
    ckpt.save(cfg.checkpoint, comm, step, state, _settings(cfg))
    return step


def _resume(comm: Communicator, cfg: TrainConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            scheduler: Any, strategy: Any) -> int:
    """Load the latest checkpoint of ``cfg.checkpoint`` into the run's parts, if there is one
    (before ``strategy.setup()``); returns the iteration to continue from (0: none)."""
    if cfg.checkpoint is None:
        return 0

    def read_and_restore() -> tuple[int, int, dict[str, Any]] | None:
        found = ckpt.load(cfg.checkpoint, comm, _settings(cfg))
        if found is not None:
            _restore(comm, cfg, found, model, optimizer, scheduler, strategy)
        return found

    # Every rank learns whether every rank could resume: one damaged file ends the job with its
    # own message on all ranks, and no rank waits in a collective for a peer that left.
    found = ckpt.together(comm, read_and_restore)
    if found is None:
        return 0
    step, world_size, _ = found
    if comm.rank == 0:
        changed = "" if world_size == comm.world_size else \
            f"; it was written at {world_size} ranks and this job has {comm.world_size}: re-planned, rank r " \
            f"continues from rank r mod {world_size}'s model"
        print(f"dssync: resuming {cfg.strategy} at iteration {step} from {cfg.checkpoint}{changed}", file=sys.stderr)
    return step


def _restore(comm: Communicator, cfg: TrainConfig, found: tuple[int, int, dict[str, Any]], model: torch.nn.Module,
             optimizer: torch.optim.Optimizer, scheduler: Any, strategy: Any) -> None:
    """Load this rank's checkpointed ``state`` into the run's parts (no collective)."""
    step, _, state = found
    if step >= cfg.steps:
        raise ckpt.CheckpointError(f"{cfg.checkpoint}: the run finished there (step {step} of {cfg.steps}); "
                                   "nothing to resume")
    try:
        model.load_state_dict(state["model"])  # copies in place: flat buffers stay bound
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        strategy.load_state_dict(state["strategy"])
        torch.set_rng_state(state["rng"])
        if cfg.device == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        if isinstance(exc, DssyncError):
            raise
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ckpt.CheckpointError(f"rank {comm.rank}: the checkpoint of step {step} in {cfg.checkpoint} does not fit "
                                   f"this run ({type(exc).__name__}: {reason})") from None


def _probed(comm: Communicator, cfg: TrainConfig) -> Topology | None:
    """The probed topology (``dssync probe``'s measurement), when ``cfg`` asks for one and the
    ranks are on more than one host; ``None`` otherwise."""
    if not cfg.probe_first or not get_strategy(cfg.strategy).probes:
        return None
    return probe_across_hosts(comm, timeout_s=cfg.timeout_s, library=cfg.backend,  # over this job's own library
                              prior=parse_racks_from(cfg.racks_from) if cfg.racks_from else None)


def _progress(cfg: TrainConfig, world_size: int) -> tuple[Any, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True))
    task_id = bar.add_task(f"{cfg.strategy} on {cfg.task}, {world_size} ranks", total=cfg.steps)
    bar.start()
    return bar, task_id


def train(cfg: TrainConfig, *, nproc: int | None) -> dict[str, Any] | None:
    """Run ``cfg`` on ``nproc`` local ranks (or this rank under a launcher).

    Returns rank 0's record; ``None`` on the other ranks of a launched job.
    """
    launched = from_environ()
    world_size = launched.world_size if launched is not None else nproc
    if cfg.topology is not None and world_size is not None and cfg.topology.world_size != world_size:
        raise TopologyError(
            f"the topology has {cfg.topology.world_size} workers but the job has {world_size} "
            f"ranks; use --nproc {cfg.topology.world_size} or a topology for {world_size} ranks"
        )
    if cfg.topology is None and world_size is not None and world_size > 1 and cfg.num_racks > world_size:
        raise TopologyError(f"{cfg.num_racks} racks need at least {cfg.num_racks} ranks; the job has {world_size}")
    if cfg.schedule is not None and world_size is not None and cfg.schedule.world_size != world_size:
        raise ScheduleError(
            f"the schedule is for {cfg.schedule.world_size} ranks but the job has {world_size}; "
            "plan one for this job with `dssync plan`"
        )
    if cfg.device == "cuda" and launched is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not gpus or (world_size or 0) > gpus:
            raise BackendUnavailableError(f"--device cuda puts each rank on a GPU of its own (NCCL takes no two ranks "
                                          f"on one GPU); {world_size} ranks, {gpus} GPUs visible here")
    if cfg.checkpoint is not None:
        ckpt.check(cfg.checkpoint, _settings(cfg))  # a mismatch fails here, before any rank starts
    results = run_ranks(train_rank, cfg, nproc=nproc, timeout_s=cfg.timeout_s, backend=cfg.backend)
    return results[0]
