"""Which group each rank averages with at each iteration, and online regrouping.

A ``Shuffle`` follows a schedule (planned from the topology unless one is given) from the
iteration at which it took effect, keeps the window of group timings, and, every
``adjust_every`` iterations, senses contention and the pace from them and switches every
rank to the same new plan at the same iteration (``regroup``). Its ``state_dict`` holds all
of that, so a resumed run picks the same group at every later iteration as one that never
stopped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dssync._jsonfile import is_whole
from dssync.collectives import Communicator, Group
from dssync.errors import DssyncError, ScheduleError
from dssync.planning.planner import contended, plan, with_uplink_probes
from dssync.planning.regroup import (
    DEFAULT_MAX_PACE,
    Record,
    Sensed,
    cross_rack_pace,
    sense_contention,
    settle,
)
from dssync.planning.schedule import Schedule
from dssync.topology import Topology

__all__ = ["Shuffle"]


class Shuffle:
    """Divide-and-shuffle groups over time for one rank of ``comm``.

    ``adjust_every``: regroup online every this many iterations (0: never); ``max_pace``:
    how rarely racks may exchange when the cross-rack group is the bottleneck; ``steps``:
    the iterations the run takes, if known (no regrouping for iterations that never run);
    ``nbytes``: the bytes one group allreduce moves; ``plan``: ``planner.plan``'s ``kind``
    (``auto``, or ``adjusted`` for the paper's plan around every slow link); ``world_every``:
    every this many iterations the whole world averages in place of that iteration's group
    (0: never, as in the paper), which bounds how far the ranks' models drift apart
    (periodic global averaging, as gossip methods add it) at the price of one world allreduce;
    ``world_first``: the first this many iterations average over the whole world, every one
    (post-local SGD's warm-up: the ranks start from one consensus and the plan takes over).
    """

    def __init__(self, comm: Communicator, topology: Topology, schedule: Schedule | None = None, *,
                 adjust_every: int = 0, max_pace: int = DEFAULT_MAX_PACE, steps: int | None = None, nbytes: int = 0,
                 plan: str = "auto", world_every: int = 0, world_first: int = 0) -> None:
        if world_every < 0 or world_first < 0:
            raise ValueError(f"world_every and world_first must be 0 (never) or more, got {world_every} "
                             f"and {world_first}")
        self.comm = comm
        self.world_every = world_every
        self.world_first = world_first
        self.kind = plan
        self.nbytes = nbytes  # what one group allreduce moves: timings become bandwidths
        self.topology = topology
        self.adjust_every = adjust_every
        self.max_pace = max_pace
        self.steps = steps
        self.schedule: Schedule = schedule or self._plan(topology)
        if self.schedule.world_size != comm.world_size:
            raise ScheduleError(
                f"the schedule is for {self.schedule.world_size} ranks but this job has "
                f"{comm.world_size}; plan it for the job's topology"
            )
        self.start = 0  # the iteration at which self.schedule's round 0 ran
        self.contention = contended(topology)
        self.pace = 1
        self.last: Sensed | None = None  # the previous window's answer (``regroup.settle``)
        self.records: list[Record] = []
        self.changes: list[dict[str, Any]] = [self._change(0, "initial")]

    def setup(self) -> None:
        """Check that every rank holds the same schedule, then create its groups (collective)."""
        self._agree(self.schedule, "hold different schedules", "give every rank the same schedule file")
        self.comm.register_groups(self.schedule.distinct_groups())

    def group(self, step: int) -> Group:
        """This rank's group at iteration ``step``: the whole world at a ``world_every`` step."""
        if self.world_step(step):
            return tuple(range(self.comm.world_size))
        return self.schedule.group_of(self.comm.rank, step - self.start)

    def world_step(self, step: int) -> bool:
        """Whether the whole world averages at iteration ``step`` (one of the first
        ``world_first``, or every ``world_every``-th)."""
        return step < self.world_first or (bool(self.world_every) and (step + 1) % self.world_every == 0)

    def record(self, step: int, group: Group, seconds: float) -> None:
        """Keep one group allreduce's time for the next regrouping (when regrouping online;
        a world average is no round of the plan, so its time is not kept)."""
        if self.adjust_every and not self.world_step(step):
            self.records.append((step, group, seconds))

    def after(self, step: int) -> bool:
        """Regroup after iteration ``step`` when a window ends there (collective then)."""
        every = self.adjust_every
        last = self.steps is not None and step + 1 >= self.steps
        if not every or (step + 1) % every or last:  # no plan for iterations that never run
            return False
        if all(self.world_step(s) for s in range(step + 1 - every, step + 1)):
            return False  # a window of world averages only timed no group: nothing to regroup from
        return self.regroup(step + 1)

    def _plan(self, topology: Topology, pace: int = 1) -> Schedule:
        """The plan for ``topology``; when regrouping online, with probe rounds that let the
        timings single out a slow uplink among three racks or more (``with_uplink_probes``)."""
        schedule = plan(topology, pace=pace, kind=self.kind)
        return with_uplink_probes(schedule, topology) if self.adjust_every else schedule

    def _agree(self, schedule: Schedule, what: str, fix: str) -> None:
        digests = self.comm.allgather_object(schedule.digest())
        if len(set(digests)) != 1:
            raise ScheduleError(f"rank {self.comm.rank}: ranks {what} (digest by rank: "
                                f"{dict(enumerate(digests))}); {fix}")

    def regroup(self, next_step: int) -> bool:
        """Sense contention and the pace from the window's group timings; switch plans at
        ``next_step`` where this window and the one before agree on a change (``settle``).

        Collective. Every rank gathers every rank's records, so all compute the same answer
        and the same plan; the plan's digest is still compared across ranks, and a mismatch
        is an error, never a hang in mismatched groups. Returns whether the plan changed.
        """
        window = [rec for part in self.comm.allgather_object(self.records) for rec in part]
        self.records = []
        racks = [self.topology.rack_of(r) for r in range(self.comm.world_size)]
        now: Sensed = (sense_contention(window, racks, self.nbytes, current=self.contention),
                       cross_rack_pace(window, racks, current=self.pace, max_pace=self.max_pace,
                                       slow_racks=self.contention[0]))
        before, self.last = self.last, now
        sensed, pace = settle((self.contention, self.pace), before, now)
        if sensed != tuple(self.contention):
            # One decision at a time: these windows ran the plan for the flags in force, so
            # the pace they ask for is that plan's; a plan for new flags is paced, if at all,
            # from windows that ran it.
            pace = self.pace
        if sensed == tuple(self.contention) and pace == self.pace:
            return False
        uplinks, nics = sensed
        topology = dataclasses.replace(self.topology, contention={
            "uplinks": [{"rack": r} for r in uplinks], "nics": [{"rank": i} for i in nics]})
        try:
            schedule = self._plan(topology, pace)
        except ScheduleError:
            return False  # no plan keeps these apart and still mixes: stay on the current one
        self.contention, self.pace = sensed, pace
        self._agree(schedule, f"planned different schedules at iteration {next_step}",
                    "their timing records disagree")
        if schedule.digest() == self.schedule.digest():
            return False
        self.comm.register_groups(schedule.distinct_groups())
        self.schedule, self.start = schedule, next_step
        self.last = None  # the next change needs two windows of this plan
        parts = ([f"slow uplinks {uplinks}, slow NICs {nics}"] if uplinks or nics else []) + \
            ([f"racks exchange every {pace} rounds"] if pace > 1 else [])
        reason = ", ".join(parts) or "contention cleared"
        self.changes.append(self._change(next_step, reason))
        return True

    def _change(self, step: int, reason: str) -> dict[str, Any]:
        """A schedule change as the run's record keeps it: when, why, the schedule, and the
        slow uplinks (racks), slow NICs (ranks) and pace it was planned for."""
        uplinks, nics = self.contention
        return {"step": step, "reason": reason, "schedule": self.schedule.to_dict(), "uplinks": sorted(uplinks),
                "nics": sorted(nics), "pace": self.pace}

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything that decides later groups: the schedule in force and where it started,
        the contention and pace it was planned for, the previous window's answer, the
        window's records, the changes so far."""
        return {"world_size": self.comm.world_size, "schedule": self.schedule.to_dict(), "start": self.start,
                "contention": [list(self.contention[0]), list(self.contention[1])], "pace": self.pace,
                "last": None if self.last is None else [[list(f) for f in self.last[0]], self.last[1]],
                "records": [(s, list(g), t) for s, g, t in self.records], "changes": list(self.changes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` (call ``setup()`` after, to create the schedule's groups).
        Saved at another world size, the schedule cannot apply: the plan for this job's
        topology stays, regrouping starts afresh, and the change is recorded with its reason."""
        try:
            world_size = _whole(state["world_size"])
            if world_size != self.comm.world_size:
                self.changes.append({"step": 0, "reason": f"resumed at {self.comm.world_size} ranks from a "
                                     f"checkpoint of {world_size}: re-planned", "schedule": self.schedule.to_dict()})
                return
            schedule = Schedule.from_dict(state["schedule"], source="checkpoint")
            start, pace = _whole(state["start"]), _whole(state["pace"])
            uplinks, nics = state["contention"]
            contention = ([_whole(r) for r in uplinks], [_whole(r) for r in nics])
            records = [(_whole(s), tuple(_whole(r) for r in g), float(t)) for s, g, t in state["records"]]
            last = state.get("last")  # absent from a checkpoint written before the two-window rule
            if last is not None:
                (last_uplinks, last_nics), last_pace = last
                last = (([_whole(r) for r in last_uplinks], [_whole(r) for r in last_nics]), _whole(last_pace))
            changes = list(state["changes"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, DssyncError):
                raise
            raise DssyncError(f"rank {self.comm.rank}: the divide-and-shuffle state to resume from is malformed "
                              f"({type(exc).__name__}: {exc}); it is not a state_dict() of this dssync") from None
        self.schedule, self.start, self.contention, self.pace, self.last = schedule, start, contention, pace, last
        self.records, self.changes = records, changes


def _whole(value: Any) -> int:
    """``value`` if it is a whole number, else ``TypeError``."""
    if not is_whole(value):
        raise TypeError(f"{value!r} is not a whole number")
    return value
