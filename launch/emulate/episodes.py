"""Straggler episodes: transient CPU caps, NIC rates and delays of one worker, applied at
their times while ``run`` runs a job."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .contention import set_cpu_quota
from .shaping import check_netem, delay_nic, shape_nic
from .state import Cluster, EmulationError, delay_seconds, load_state, parse_rate

# -- straggler episodes ----------------------------------------------------------------------
#: An episode starts and lasts less than this many seconds (a year): a timer past the float
#: range, or past what a thread's wait takes, would end the thread that runs the episodes.
MAX_EPISODE_S = 365 * 86400.0
_EPISODE = re.compile(r"(\d+):(cpu|nic|delay)=([^@\s]+)@(\d*\.?\d+)s?\+(\d*\.?\d+)s?")
_EPISODE_EXAMPLE = "e.g. 1:cpu=0.1@5+20, 3:nic=100mbit@0+30 or 2:delay=30ms@10+60"


@dataclass(frozen=True)
class Episode:
    """A transient straggler: worker ``rank`` capped at ``cpu`` cores, or its NIC shaped at
    ``nic`` (both directions), or ``delay`` added to its NIC (each direction, ``netem``), from
    ``start_s`` to ``start_s + duration_s`` seconds after ``run`` launches the job. Exactly one
    of ``cpu``, ``nic`` and ``delay`` is set. ``str()`` gives the ``parse_episode`` form."""

    rank: int
    start_s: float
    duration_s: float
    cpu: float | None = None
    nic: str | None = None
    delay: str | None = None

    def __post_init__(self) -> None:
        kinds = [k for k in ("cpu", "nic", "delay") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"an episode changes exactly one of cpu, nic and delay, got {kinds or 'none'}; "
                             f"{_EPISODE_EXAMPLE}")
        if self.rank < 0:
            raise ValueError(f"an episode's rank is 0 or more, got {self.rank}")
        if not (0 <= self.start_s < MAX_EPISODE_S and 0 < self.duration_s < MAX_EPISODE_S):
            raise ValueError(f"an episode starts at 0 s or later and lasts more than 0 s, got start "
                             f"{self.start_s} s, duration {self.duration_s} s")
        if self.cpu is not None and not 0 < self.cpu < float("inf"):
            raise ValueError(f"a CPU episode caps at a positive number of cores, got {self.cpu}")
        if self.nic is not None:
            parse_rate(self.nic)
        if self.delay is not None:
            delay_seconds(self.delay)

    @property
    def kind(self) -> str:
        return "cpu" if self.cpu is not None else "nic" if self.nic is not None else "delay"

    @property
    def value(self) -> float | str:
        return getattr(self, self.kind)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def __str__(self) -> str:
        return f"{self.rank}:{self.kind}={self.value}@{self.start_s!r}+{self.duration_s!r}"


def parse_episode(text: str) -> Episode:
    """``RANK:KIND=VALUE@START+DURATION``, KIND one of ``cpu`` (cores), ``nic`` (a rate) and
    ``delay`` (``30ms``), START and DURATION in seconds: ``1:cpu=0.1@5+20`` caps worker 1 at
    a tenth of a core from 5 s to 25 s after the job starts."""
    m = _EPISODE.fullmatch(str(text).strip())
    if not m:
        raise ValueError(f"cannot read episode {text!r}; write RANK:KIND=VALUE@START+DURATION with KIND "
                         f"cpu (cores), nic (a rate) or delay (ms), times in seconds: {_EPISODE_EXAMPLE}")
    rank, kind, value, start, duration = m.groups()
    if kind == "cpu":
        try:
            cores = float(value)
        except ValueError:
            raise ValueError(f"cannot read episode {text!r}: cpu={value} is not a number of cores; "
                             f"{_EPISODE_EXAMPLE}") from None
        return Episode(int(rank), float(start), float(duration), cpu=cores)
    try:
        return Episode(int(rank), float(start), float(duration), **{kind: value})
    except ValueError as exc:
        raise ValueError(f"cannot read episode {text!r}: {exc}") from None


def check_episodes(c: Cluster, episodes: Sequence[Episode]) -> None:
    """Raise before anything runs if an episode names no worker of ``c`` or needs netem here."""
    for e in episodes:
        if not 0 <= e.rank < c.world_size:
            raise ValueError(f"episode {e}: cluster {c.name!r} has workers 0..{c.world_size - 1}")
    if any(e.delay is not None for e in episodes):
        check_netem()


class Episodes:
    """Applies episodes at their times after ``start`` from a daemon thread; ``stop`` undoes
    what is still on. Each change sets a worker's CPU or NIC to what the episodes still on ask
    for (the latest begun wins), or else to what the cluster's state says (``contend``)."""

    def __init__(self, c: Cluster, episodes: Sequence[Episode], write: Callable[[str], None]) -> None:
        self.c, self.write = c, write
        # (time, begins, index, episode), an end before a start at the same time
        self.events = sorted([(e.start_s, 1, i, e) for i, e in enumerate(episodes)]
                             + [(e.end_s, 0, i, e) for i, e in enumerate(episodes)], key=lambda ev: ev[:3])
        self.cpu_ranks = sorted({e.rank for e in episodes if e.kind == "cpu"})
        self.on: list[Episode] = []
        self.delayed: set[int] = set()  # ranks with netem under their NIC's tbf
        self.t0 = 0.0
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="dssync-episodes")

    def prepare(self) -> None:
        """Make the cgroup of every worker with a CPU episode, capped at the worker's static
        limit or not at all, so that its processes start inside it."""
        for rank in self.cpu_ranks:
            set_cpu_quota(self.c, rank, self.c.cpu_limit.get(rank))

    def start(self) -> None:
        """Apply what begins at 0 s now, the rest from the thread."""
        self.t0 = time.monotonic()
        self.advance(0.0)
        if self.events:
            self.thread.start()

    def _loop(self) -> None:
        while self.events and not self.halt.is_set():
            self.halt.wait(max(0.0, self.events[0][0] - (time.monotonic() - self.t0)))
            if not self.halt.is_set():
                self.advance(time.monotonic() - self.t0)

    def advance(self, now: float) -> None:
        while self.events and self.events[0][0] <= now and not self.halt.is_set():
            _, begins, _, e = self.events.pop(0)
            if begins:
                self.on.append(e)
            elif e in self.on:
                self.on.remove(e)
            self._set(e, now, bool(begins))

    def stop(self) -> None:
        """Stop the thread, then undo every episode still on."""
        self.halt.set()
        if self.thread.is_alive():
            self.thread.join()
        self.events = []
        undo = {(e.rank, e.kind): e for e in self.on}
        self.on = []
        for e in undo.values():
            self._set(e, time.monotonic() - self.t0, False)

    def _set(self, e: Episode, now: float, begins: bool) -> None:
        """Set worker ``e.rank``'s ``e.kind`` to what the episodes on now ask for; say so."""
        rank, kind = e.rank, e.kind
        mine = [x for x in self.on if (x.rank, x.kind) == (rank, kind)]
        try:
            static = load_state(self.c.name)  # `contend` may have changed it since the job began
        except (EmulationError, ValueError, TypeError, json.JSONDecodeError):
            static = self.c
        try:
            if kind == "cpu":
                cores = mine[-1].cpu if mine else static.cpu_limit.get(rank)
                set_cpu_quota(self.c, rank, cores)
                restored = "" if cores is None else f" to {cores} cores"
            else:
                nic = [x.nic for x in self.on if (x.rank, x.kind) == (rank, "nic")]
                delay = [x.delay for x in self.on if (x.rank, x.kind) == (rank, "delay")]
                rate = parse_rate(nic[-1]) if nic else static.nic_override.get(rank, static.nic_bps)
                shape_nic(self.c, rank, rate)
                if delay or rank in self.delayed:
                    delay_nic(self.c, rank, rate, delay[-1] if delay else None)
                    (self.delayed.add if delay else self.delayed.discard)(rank)
                restored = f" to {rate / 1e6:g} Mbit/s" if kind == "nic" else ""
        except (EmulationError, OSError, ValueError) as exc:
            self.write(f"[episode] worker {rank}: cannot {'apply' if begins else 'undo'} {e}: {exc}\n")
            return
        what = (f"{mine[-1].value}" + (" cores" if kind == "cpu" else "")) if mine else "restored" + restored
        when = f"at {now:.1f} s" + (f", for {e.duration_s:g} s" if begins else "")
        self.write(f"[episode] worker {rank}: {kind} {what} ({when})\n")
