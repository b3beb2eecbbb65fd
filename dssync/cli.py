"""The ``dssync`` console script: one subcommand per module in ``dssync.commands``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dssync import __version__
from dssync.commands import bench, demo, emulate, plan, probe, simulate, train
from dssync.errors import DssyncError

__all__ = ["main"]

_COMMANDS = (demo, train, plan, bench, emulate, probe, simulate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dssync",
        description="Divide-and-shuffle synchronization for data-parallel PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"dssync {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (DssyncError, ValueError, OSError) as exc:
        if os.environ.get("DSSYNC_DEBUG"):
            raise
        print(f"dssync {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dssync {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
