"""What each strategy communicates in an iteration, as data the strategy and ``dssync simulate`` share.

A strategy's *pattern* says, for every iteration ``t`` of a run, which collectives its ranks
run, among which groups, on how many bytes, in which order (``Pattern.iteration(t)``, a tuple
of ``Op``). The strategies take their peers and groups from here (``gossip_peers``,
``rack_leaders``, ``ddp_buckets``), and a unit test runs each strategy on a recording world
and checks that the calls it makes are its pattern's. ``dssync simulate`` prices the same
patterns, so it models a strategy at any of the settings below, not only at its defaults,
without importing a strategy or torch.

Kinds of ``Op`` (every group of one ``Op`` runs at once, ranks numbered rack by rack):

- ``allreduce``: each group ring-allreduces ``nbytes`` (a group of one does nothing);
- ``reduce``: each group reduces ``nbytes`` into its first rank (gloo: a ring reduce-scatter,
  then every member's share into the root);
- ``broadcast``: each group's first rank sends ``nbytes`` to the rest (gloo: a binomial tree);
- ``send``: each group is ``(src, dst)``, a transfer of ``nbytes``; every rank sends one and
  receives one (gossip);
- ``push-pull``: every rank pushes ``nbytes`` to the parameter server's shards, spread evenly
  over every rank, and pulls as much back; a shard answers a group's pulls once every member
  of the group has pushed to it: groups of one rank, who waits for nobody (ASP), or the world
  (bulk-synchronous SGD on the servers, sync-switch's first phase).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dssync._text import parse_variant, read_settings

__all__ = ["DEFAULTS", "MODELLED", "Op", "Pattern", "communication_spec", "ddp_buckets", "gossip_peers", "pattern",
           "rack_leaders", "read_spec"]

Group = tuple[int, ...]

#: The strategies that have a pattern, in the order benchmark tables list them.
MODELLED = ("ddp", "allreduce", "hierarchical", "torch-hier", "diloco", "local-sgd", "gossip", "asp", "sync-switch",
            "ds-sync")

#: Each modelled strategy's settings that shape what it communicates, at their defaults (the
#: defaults of the strategy's own ``Config``; a unit test holds the two together).
DEFAULTS: dict[str, dict[str, Any]] = {
    "ddp": {"bucket_cap_mb": 25.0},
    "allreduce": {},
    "hierarchical": {},
    "torch-hier": {"rack_period": 1, "world_period": 4},
    "diloco": {"inner_steps": 20},
    "local-sgd": {"period": 8},
    "gossip": {"period": 1},
    "asp": {},
    "sync-switch": {"switch_at": 0.5, "policy": "none"},
    "ds-sync": {"world_every": 0, "world_first": 0.0},
}

#: DDP's first bucket (torch's ``_DEFAULT_FIRST_BUCKET_BYTES``).
DDP_FIRST_BUCKET_BYTES = 1 << 20


@dataclass(frozen=True)
class Op:
    """One collective that disjoint ``groups`` run at once (the module's docstring has the kinds)."""

    kind: str
    groups: tuple[Group, ...]
    nbytes: float


Iteration = tuple[Op, ...]
"""An iteration's ``Op``s, one after the other; ``()`` for an iteration without communication."""


@dataclass(frozen=True)
class Pattern:
    """Iteration ``t`` is ``first[t]`` for the first ``len(first)`` iterations, then
    ``cycle[t % len(cycle)]`` (counted from 0, not from the end of ``first``)."""

    first: tuple[Iteration, ...]
    cycle: tuple[Iteration, ...]

    def iteration(self, t: int) -> Iteration:
        return self.first[t] if t < len(self.first) else self.cycle[t % len(self.cycle)]


def gossip_peers(rank: int, world_size: int, step: int) -> tuple[int, int] | None:
    """``(send to, receive from)`` of ``rank`` at gossip exchange ``step``: offset
    ``2^(step mod ceil(log2 n))``; ``None`` alone."""
    if world_size < 2:
        return None
    offset = 1 << (step % (world_size - 1).bit_length())
    return (rank + offset) % world_size, (rank - offset) % world_size


def rack_leaders(racks: Sequence[Sequence[int]]) -> Group:
    """Each rack's lowest rank, sorted: hierarchical's ring among the racks."""
    return tuple(sorted(min(r) for r in racks))


def ddp_buckets(nbytes: float, bucket_cap_mb: float) -> list[float]:
    """DDP's buckets for ``nbytes`` of gradients: a first bucket of 1 MiB, then buckets of
    ``bucket_cap_mb``."""
    first, cap = float(DDP_FIRST_BUCKET_BYTES), bucket_cap_mb * (1 << 20)
    out = [min(nbytes, first)]
    rest = nbytes - out[0]
    while rest > 0:
        out.append(min(rest, cap))
        rest -= out[-1]
    return out


def read_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"ds-sync:world_first=0.25"`` -> ``("ds-sync", {"world_every": 0, "world_first": 0.25})``:
    a modelled strategy (``parse_variant``) and its settings over ``DEFAULTS``, each read as its
    default's type (``read_settings``, as ``--set`` reads a strategy's). A name or setting the
    patterns do not know is a ``ValueError`` naming it."""
    name, pairs = parse_variant(spec)
    if name not in DEFAULTS:
        raise ValueError(f"unknown strategy {name!r} for the simulator; choose from {', '.join(MODELLED)}")
    shape = dataclasses.make_dataclass(name.replace("-", "_"), [(k, type(v), v) for k, v in DEFAULTS[name].items()])
    return name, {**DEFAULTS[name], **read_settings(shape, pairs, f"the simulator's model of {name}", flag=repr(spec))}


def communication_spec(variant: str) -> str:
    """A strategy variant as a comparison names it (``"diloco:inner_steps=4:outer_lr=1.0"``)
    with only the settings that shape its communication (``"diloco:inner_steps=4"``), so
    that the simulator prices the variant that was trained; ``ValueError`` for a strategy
    without a pattern. A ``--`` option of the run's ``dssync train`` shapes nothing here."""
    name, pairs = parse_variant(variant)
    if name not in DEFAULTS:
        raise ValueError(f"the simulator has no model of {name!r}; choose from {', '.join(MODELLED)}")
    keep = [kv for kv in pairs if not kv.startswith("--") and kv.partition("=")[0].strip() in DEFAULTS[name]]
    return ":".join([name, *keep])


def pattern(spec: str, racks: Sequence[Sequence[int]], nbytes: float, *, steps: int = 0,
            plan_period: Sequence[Sequence[Sequence[int]]] = ()) -> Pattern:
    """The pattern of ``spec`` (a name from ``MODELLED``, with ``:KEY=VALUE`` settings) on
    ``racks`` when every rank exchanges a model of ``nbytes``, in a run of ``steps`` iterations
    (ds-sync's ``world_first`` is a fraction of them). ``plan_period``: ds-sync's planned
    rounds, each a partition of the ranks (``planner.plan(...).period``)."""
    name, s = read_spec(spec)
    racks = [tuple(sorted(r)) for r in racks]
    n = sum(len(r) for r in racks)
    world: tuple[Group, ...] = (tuple(range(n)),)

    def every(period: int, op: Iteration) -> tuple[Iteration, ...]:
        return ((),) * (period - 1) + (op,)

    world_average: Iteration = (Op("allreduce", world, nbytes),)
    if name in ("allreduce", "ddp"):
        sizes = [nbytes] if name == "allreduce" else ddp_buckets(nbytes, s["bucket_cap_mb"])
        return Pattern((), (tuple(Op("allreduce", world, b) for b in sizes),))
    if name == "hierarchical":
        local = tuple(r for r in racks if len(r) > 1)
        ops = [Op("reduce", local, nbytes)] if local else []
        if len(racks) > 1:
            ops.append(Op("allreduce", (rack_leaders(racks),), nbytes))
        if local:
            ops.append(Op("broadcast", local, nbytes))
        return Pattern((), (tuple(ops),))
    if name == "torch-hier":  # torch's averager: the largest period dividing the step counter (from 0)
        rack, wp = s["rack_period"], s["world_period"]
        if rack < 1 or wp < 1 or wp % rack:
            raise ValueError(f"{spec!r}: periods must be at least 1 and world_period a multiple of rack_period")
        by_rack = (Op("allreduce", tuple(racks), nbytes),)
        return Pattern((), tuple(world_average if t % wp == 0 else by_rack if t % rack == 0 else ()
                                 for t in range(wp)))
    if name in ("diloco", "local-sgd"):  # one world average after every H (period) local steps
        h = s["inner_steps"] if name == "diloco" else s["period"]
        if h < 1:
            raise ValueError(f"{spec!r}: the period must be at least 1, got {h}")
        return Pattern((), every(h, world_average))
    if name == "gossip":
        period = s["period"]
        if period < 1:
            raise ValueError(f"{spec!r}: period must be at least 1, got {period}")
        if n < 2:
            return Pattern((), ((),))
        rounds = []
        for k in range(max(1, (n - 1).bit_length())):
            pairs = tuple((r, gossip_peers(r, n, k)[0]) for r in range(n))
            rounds += every(period, (Op("send", pairs, nbytes),))
        return Pattern((), tuple(rounds))
    asp: Iteration = (Op("push-pull", tuple((r,) for r in range(n)), nbytes),)
    if name == "asp":
        return Pattern((), (asp,))
    if name == "sync-switch":  # BSP on the servers for the first switch_at of the run, then ASP
        if s["policy"] != "none":
            raise ValueError(f"{spec!r}: a {s['policy']} policy switches when it measures a straggler, which a "
                             "pattern cannot say; the simulator models policy=none, the switch at switch_at")
        if not 0 <= s["switch_at"] <= 1:
            raise ValueError(f"{spec!r}: switch_at is a fraction of the run in [0, 1]")
        bsp: Iteration = (Op("push-pull", world, nbytes),)
        switch = round(s["switch_at"] * steps)
        # The switch itself (barriers, a pull of the settled parameters, new servers) is the
        # strategy's untimed bookkeeping after an iteration's communication (switch_s in its
        # stats), in no iteration's communication time: it is not in the pattern.
        return Pattern((bsp,) * switch, (bsp if switch >= steps > 0 else asp,))
    # ds-sync: the plan's rounds, the world in place of every world_every-th iteration and
    # of each of the first world_first of the run's
    if not plan_period:
        raise ValueError("ds-sync's pattern needs the plan's rounds (plan_period)")
    every_k, frac = s["world_every"], s["world_first"]
    if every_k < 0 or not 0 <= frac < 1:
        raise ValueError(f"{spec!r}: world_every must be 0 or more and world_first in [0, 1)")
    rounds = [(Op("allreduce", tuple(tuple(sorted(g)) for g in part), nbytes),) for part in plan_period]
    length = math.lcm(len(rounds), every_k) if every_k else len(rounds)
    cycle = tuple(world_average if every_k and (t + 1) % every_k == 0 else rounds[t % len(rounds)]
                  for t in range(length))
    first = math.ceil(frac * steps)
    return Pattern(tuple(world_average for _ in range(first)), cycle)
