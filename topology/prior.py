"""Racks a user already knows (``dssync probe --racks-from``), as a prior the measurement checks.

Two sources give every rank's rack from its host name (``host_name()``: ``DSSYNC_HOST``,
else the hostname):

- ``hostnames:REGEX``: the host name is searched for ``REGEX`` (``re.search``); the rack is
  the text of the first capture group that took part in the match, or the whole match when
  none did. ``hostnames:rack(\\d+)-`` puts ``rack3-node7`` and ``rack3-node9`` in one rack.
- ``slurm``: SLURM's own topology (``scontrol show topology``, ``topology/tree`` or
  ``topology/block``): the rack is the leaf switch (level 0) or block whose node list holds
  the host (its full name, else the part before the first dot).

Racks are numbered ``0..R-1`` in order of their lowest rank, as topology.json numbers them.

The probe still measures everything; ``weigh_prior`` then compares the racks it measured
with the prior. The measurement decides the ranks it is sure of and the prior decides the
ones it is not (``confidence``'s ``unsure`` and ``unplaced``): a user's racks are a prior,
which evidence overrides and which fills in what the evidence cannot tell. Every
disagreement is recorded (``prior_disagrees``) and said on stderr, whichever side won.

Pure functions on host names and rack lists, apart from ``slurm_switches``, which runs
``scontrol`` (its runner is a parameter, so the parsing is tested without SLURM).
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dssync.errors import TopologyError
from dssync.topology.matrices import ranks_text
from dssync.topology.placement import RackFit

__all__ = ["RackPrior", "describe_disagreements", "disagreements", "expand_hostlist", "parse_racks_from",
           "parse_slurm_topology", "resolve_racks", "slurm_switches", "weigh_prior"]

HOSTNAMES = "hostnames:"


@dataclass(frozen=True)
class RackPrior:
    """What ``--racks-from`` gave: ``source`` as typed, and what it needs to name each host's
    rack (``pattern`` for ``hostnames:``, ``switches``, host to leaf switch, for ``slurm``)."""

    source: str
    pattern: str | None = None
    switches: Mapping[str, str] | None = None

    def key(self, host: str, rank: int) -> str:
        """The rack key of ``rank``'s ``host``; a ``TopologyError`` naming both when there is none."""
        if self.pattern is not None:
            match = re.search(self.pattern, host)
            if match is None:
                raise TopologyError(f"--racks-from {self.source}: rank {rank}'s host {host!r} does not match "
                                    f"{self.pattern!r}; give a pattern that every host name matches (the "
                                    "host name is DSSYNC_HOST, else the hostname)")
            return next((g for g in match.groups() if g is not None), match.group(0))
        switches = self.switches or {}
        for name in (host, host.split(".")[0]):
            if name in switches:
                return switches[name]
        raise TopologyError(f"--racks-from {self.source}: rank {rank}'s host {host!r} is under no leaf switch "
                            f"of SLURM's topology ({len(switches)} nodes in it); if SLURM names the node "
                            "otherwise, set DSSYNC_HOST to its SLURM name ($SLURMD_NODENAME)")

    def racks(self, hosts: Sequence[str]) -> list[int]:
        """The rack of every rank, numbered in order of lowest rank."""
        seen: dict[str, int] = {}
        return [seen.setdefault(self.key(host, rank), len(seen)) for rank, host in enumerate(hosts)]


def parse_racks_from(text: str, *, run: Callable[..., Any] = subprocess.run,
                     which: Callable[[str], str | None] = shutil.which) -> RackPrior:
    """``slurm`` or ``hostnames:REGEX`` as a ``RackPrior`` (``slurm`` asks ``scontrol`` now);
    a ``TopologyError`` saying what is wrong otherwise."""
    if text == "slurm":
        return RackPrior(source=text, switches=slurm_switches(run=run, which=which))
    if text.startswith(HOSTNAMES):
        pattern = text[len(HOSTNAMES):]
        if not pattern:
            raise TopologyError("--racks-from hostnames: needs a pattern after the colon, e.g. "
                                "hostnames:'rack(\\d+)-' (the first group names the rack)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TopologyError(f"--racks-from {text}: {pattern!r} is no regular expression ({exc})") from None
        return RackPrior(source=text, pattern=pattern)
    raise TopologyError(f"--racks-from takes slurm or hostnames:REGEX, got {text!r}")


# -- SLURM -----------------------------------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """A SLURM hostlist as host names, in order: ``tux[01-03,7],db`` is ``tux01 tux02 tux03
    tux7 db``; several brackets in a name expand as a product (``r[1-2]n[1-2]``); a range's
    numbers are padded to its lower bound's width, as SLURM pads them. A ``ValueError`` for
    what it does not know (nested or unclosed brackets, a range that is not numbers)."""
    names: list[str] = []
    part, depth = "", 0
    for ch in f"{text.strip()},":
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in hostlist {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in hostlist {text!r}")
        if ch == "," and depth == 0:
            if part.strip():
                names.extend(_expand_name(part.strip(), text))
            part = ""
        else:
            part += ch
    if depth:
        raise ValueError(f"unbalanced brackets in hostlist {text!r}")
    return names


def _expand_name(name: str, text: str) -> list[str]:
    pieces = re.split(r"\[([^\]]*)\]", name)  # literal, ranges, literal, ranges, ..., literal
    choices: list[list[str]] = []
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            choices.append([piece])
            continue
        values: list[str] = []
        for item in piece.split(","):
            match = _RANGE.match(item.strip())
            if match is None:
                raise ValueError(f"{item!r} in hostlist {text!r} is no number or range of numbers")
            low, high = match.group(1), match.group(2) or match.group(1)
            if int(high) < int(low):
                raise ValueError(f"range {item!r} in hostlist {text!r} runs backwards")
            values.extend(str(v).zfill(len(low)) for v in range(int(low), int(high) + 1))
        choices.append(values)
    return ["".join(parts) for parts in itertools.product(*choices)]


def parse_slurm_topology(text: str, expand: Callable[[str], list[str]] = expand_hostlist) -> dict[str, str]:
    """Host to leaf switch, from ``scontrol show topology``'s output.

    ``SwitchName=s1 Level=0 LinkSpeed=1 Nodes=node[01-04]``: a leaf switch (level 0; a switch
    line without a level is a leaf when it lists nodes and no switches). ``BlockName=b1
    BlockIndex=0 Nodes=...`` (``topology/block``): a block. Upper switches (level 1 and up)
    list all nodes below them and are left out. A node under two leaves is an error.
    """
    found: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(token.split("=", 1) for token in line.split() if "=" in token)
        nodes = fields.get("Nodes", "")
        if not nodes or nodes == "(null)":
            continue
        if "SwitchName" in fields:
            level = fields.get("Level")
            leaf = level == "0" if level is not None else "Switches" not in fields
            name = fields["SwitchName"]
        elif "BlockName" in fields:
            leaf, name = True, fields["BlockName"]
        else:
            continue
        if not leaf:
            continue
        for node in expand(nodes):
            if found.get(node, name) != name:
                raise TopologyError(f"SLURM's topology puts node {node} under two leaf switches, "
                                    f"{found[node]} and {name}")
            found[node] = name
    return found


def slurm_switches(*, run: Callable[..., Any] = subprocess.run,
                   which: Callable[[str], str | None] = shutil.which) -> dict[str, str]:
    """Host to leaf switch from this cluster's SLURM (``scontrol show topology``).

    Node lists are expanded in Python (one leaf switch after another, no process each);
    a list whose syntax the expander does not know goes to ``scontrol show hostnames``.
    """
    scontrol = which("scontrol")
    if scontrol is None:
        raise TopologyError("--racks-from slurm needs scontrol, SLURM's client, on the PATH; it is not "
                            "there (run under SLURM, or use --racks-from hostnames:REGEX)")

    def scontrol_out(*args: str) -> str:
        try:
            proc = run([scontrol, "show", *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TopologyError(f"--racks-from slurm: scontrol show {' '.join(args)} failed: {exc}") from None
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout or "").strip().splitlines()
            raise TopologyError(f"--racks-from slurm: scontrol show {' '.join(args)} failed "
                                f"(exit {proc.returncode}){': ' + why[0] if why else ''}")
        return proc.stdout

    def expand(nodes: str) -> list[str]:
        try:
            return expand_hostlist(nodes)
        except ValueError:
            return scontrol_out("hostnames", nodes).split()

    switches = parse_slurm_topology(scontrol_out("topology"), expand)
    if not switches:
        raise TopologyError("--racks-from slurm: SLURM reports no topology (scontrol show topology lists no "
                            "leaf switch with nodes; slurm.conf needs TopologyPlugin=topology/tree or "
                            "topology/block); use --racks-from hostnames:REGEX instead")
    return switches


# -- the prior against the measurement ------------------------------------------------------

def _renumber(labels: Sequence[Any]) -> list[int]:
    seen: dict[Any, int] = {}
    return [seen.setdefault(label, len(seen)) for label in labels]


def resolve_racks(measured: Sequence[int], prior: Sequence[int],
                  unsure: set[int] | Sequence[int]) -> tuple[list[int], list[int]]:
    """The racks to use, and the ranks whose rack the prior decided: the measured rack of
    every rank the measurement is sure of, and for each rank in ``unsure`` the rack the
    prior gives it.

    An unsure rank joins the measured rack of the sure ranks that the prior puts beside it;
    with none there, it forms a rack with the other unsure ranks of its prior rack. Where the
    prior puts it beside sure ranks of several measured racks (which the measurement keeps
    apart), the prior contradicts the evidence: its measured rack stays, and the prior
    decided nothing for it.
    """
    n = len(measured)
    if len(prior) != n:
        raise ValueError(f"the prior names {len(prior)} ranks, the measurement {n}")
    unsure = set(unsure)
    labels: list[tuple[str, int]] = []
    decided = []
    for j in range(n):
        beside = {measured[k] for k in range(n) if k not in unsure and prior[k] == prior[j]}
        if j in unsure and len(beside) <= 1:
            labels.append(("measured", beside.pop()) if beside else ("prior", prior[j]))
            decided.append(j)
        else:
            labels.append(("measured", measured[j]))
    return _renumber(labels), decided


def disagreements(measured: Sequence[int], prior: Sequence[int]) -> list[dict[str, list[int]]]:
    """Where the two racks part: for every set of ranks that both put together (one rack in
    each) while one of them puts others beside it, ``{"ranks", "measured_with",
    "prior_with"}``: the ranks only the measurement, and only the prior, puts in their rack.
    Empty when the two are the same racks."""
    blocks: dict[tuple[int, int], list[int]] = {}
    for i, (m, p) in enumerate(zip(measured, prior, strict=True)):
        blocks.setdefault((m, p), []).append(i)
    out = []
    for (m, p), ranks in sorted(blocks.items(), key=lambda item: item[1][0]):
        measured_with = [k for k, r in enumerate(measured) if r == m and prior[k] != p]
        prior_with = [k for k, r in enumerate(prior) if r == p and measured[k] != m]
        if measured_with or prior_with:
            out.append({"ranks": ranks, "measured_with": measured_with, "prior_with": prior_with})
    return out


def describe_disagreements(source: str, entries: Sequence[Mapping[str, Sequence[int]]]) -> list[str]:
    """One line per disagreement, leaving out a line whose every pair an earlier line named."""
    said: set[frozenset[int]] = set()
    lines = []
    for e in entries:
        pairs = {frozenset((a, b)) for a in e["ranks"] for b in [*e["measured_with"], *e["prior_with"]]}
        if pairs <= said:
            continue
        said |= pairs
        one = len(e["ranks"]) == 1
        who = f"{ranks_text(e['ranks'])} {'measures' if one else 'measure'}"
        own = "its own" if one else "their own"
        where = (f"as one rack with {ranks_text(e['measured_with'])}" if e["measured_with"]
                 else f"as a rack of {own}")
        instead = f"with {ranks_text(e['prior_with'])}" if e["prior_with"] else own
        lines.append(f"--racks-from {source}: {who} {where}, not {instead}")
    return lines


def weigh_prior(fit: RackFit, prior: Sequence[int], source: str, *,
                report: bool = False) -> tuple[list[int], dict[str, Any]]:
    """The racks the probe keeps, the measurement's (``fit``, after placement) checked
    against ``prior``, and what goes into topology.json's ``confidence``.

    The measurement decides every rank it is sure of; the prior the ranks it is unsure of
    or could not place (``resolve_racks``). The record: ``racks_from`` (``source``, the
    ``prior`` and ``measured`` racks, and ``prior_decides``, the ranks whose rack the
    prior decided), ``prior_disagrees`` (``disagreements``: measured against prior, whoever
    won), and ``unsure``, ``unplaced``, ``one_rack_guess`` and ``unsettled`` without what the prior decided.
    The rest of ``confidence`` (``confident``, ``boundaries``) describes the measurement,
    racks numbered as in ``racks_from.measured``. With ``report``, disagreements (and racks
    the prior decided) are said on stderr, each line a warning.
    """
    measured = fit.racks()
    conf = fit.confidence()
    racks, decided = resolve_racks(measured, prior, set(conf["unsure"]) | set(conf["unplaced"]))
    entries = disagreements(measured, prior)
    record = {
        "racks_from": {"source": source, "prior": list(prior), "measured": measured, "prior_decides": decided},
        "prior_disagrees": entries,
        "unsure": [j for j in conf["unsure"] if j not in decided],
        "unplaced": [j for j in conf["unplaced"] if j not in decided],
        "one_rack_guess": conf["one_rack_guess"] and not decided,  # the prior's racks are written instead
        "unsettled": [j for j in conf["unsettled"] if j not in decided],
    }
    if report:
        lines = describe_disagreements(source, entries)
        if lines or racks != measured:
            if racks == measured:
                lines.append(f"--racks-from {source}: the probe keeps the measured racks (the measurement "
                             "is sure of them)")
            elif racks == _renumber(prior):
                lines.append(f"--racks-from {source}: the measurement is unsure of {ranks_text(decided)}; the probe "
                             "keeps the prior's racks")
            else:
                lines.append(f"--racks-from {source}: the measurement is unsure of {ranks_text(decided)}; the probe "
                             "keeps the measured racks with them placed as the prior says")
        for line in lines:
            print(f"warning: {line}", file=sys.stderr, flush=True)
    return racks, record
