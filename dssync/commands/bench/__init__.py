"""``dssync bench``: measurements, each printed as a table and written as JSON, one module per subcommand."""

from __future__ import annotations

import argparse

from dssync.commands.bench import (
    allreduce,
    averaging,
    compare,
    ensemble,
    overlap,
    predict,
    probe_backends,
    probe_layouts,
    simcheck,
    tune,
)
from dssync.commands.bench._shared import COMPARE_STRATEGIES
from dssync.commands.bench.allreduce import run_allreduce
from dssync.commands.bench.averaging import run_averaging
from dssync.commands.bench.compare import run_compare
from dssync.commands.bench.ensemble import run_ensemble
from dssync.commands.bench.overlap import run_overlap
from dssync.commands.bench.predict import run_predict
from dssync.commands.bench.probe_backends import run_probe_backends
from dssync.commands.bench.probe_layouts import run_probe_layouts
from dssync.commands.bench.simcheck import run_simcheck
from dssync.commands.bench.tune import run_tune

__all__ = ["COMPARE_STRATEGIES", "add_parser", "run_ensemble", "run_allreduce", "run_compare", "run_averaging", "run_simcheck", "run_predict", "run_overlap", "run_probe_backends", "run_probe_layouts", "run_tune"]

#: The subcommands, in the order ``dssync bench --help`` lists them.
_SUBCOMMANDS = (allreduce, compare, tune, simcheck, predict, ensemble, averaging, probe_backends, probe_layouts, overlap)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for module in _SUBCOMMANDS:
        module.add_parser(bsub)
