"""The ``dssync`` console script: one subcommand per module in ``dssync.commands``."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

if sys.argv[1:2] == ["emulate"]:
    # `emulate run` forks its workers from this process after torch is imported here; the
    # namespaces have no resolver, and c10d would warn about it on every connection.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from dssync import __version__  # noqa: E402
from dssync.errors import DssyncError  # noqa: E402

__all__ = ["Terminated", "build_parser", "main", "raise_on_sigterm"]

#: The subcommands, each a module of ``dssync.commands``, in ``--help`` order.
_COMMANDS = ("demo", "train", "plan", "bench", "emulate", "probe", "simulate", "tune")


class Terminated(BaseException):
    """SIGTERM arrived (``timeout``, a batch scheduler, ``kill``): raised where the program
    is, so ``finally`` blocks and context managers run, and an emulated cluster comes down."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _leaving() -> None:
    """The first SIGTERM or Ctrl-C has been handled and the program is on its way out: a
    second one (``timeout -k``, an impatient user) ends it by the signal itself, instead of
    raising into the interpreter's exit handlers and printing their traceback."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # one ignored by who started us stays so
            signal.signal(sig, signal.SIG_DFL)


def raise_on_sigterm() -> None:
    """Turn SIGTERM into ``Terminated`` in this (main) thread. Python's default is to die
    at once, which leaves namespaces, qdiscs and background flows behind."""
    signal.signal(signal.SIGTERM, _terminated)


class _Parser(argparse.ArgumentParser):
    """argparse with errors on one line, naming the flag and where to read more (not the
    whole usage block); subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _command_modules(argv: Sequence[str] | None) -> list[ModuleType]:
    """The command modules to build the parser from. Only the one ``argv`` names, so that a
    command that needs no torch (``simulate``, ``plan``, ``tune``) starts without importing
    it (some 2 s of CPU); every one for ``--help``, a mistyped command, and ``emulate``, whose
    ``run`` forks ``dssync`` workers from this process and wants torch imported before it."""
    named = next((a for a in (argv or ()) if not a.startswith("-")), None)
    names = (named,) if named in _COMMANDS and named != "emulate" else _COMMANDS
    return [importlib.import_module(f"dssync.commands.{name}") for name in names]


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``dssync`` parser: every subcommand, or, given the ``argv`` it will parse, only
    the subcommand it names (``_command_modules``)."""
    parser = _Parser(
        prog="dssync",
        description="Divide-and-shuffle synchronization for data-parallel PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"dssync {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _command_modules(argv):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(argv).parse_args(argv)
    raise_on_sigterm()
    try:
        return int(args.run(args) or 0)
    except (DssyncError, ValueError, OSError) as exc:
        if os.environ.get("DSSYNC_DEBUG"):
            raise
        print(f"dssync {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _leaving()
        print(f"dssync {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        _leaving()
        print(f"dssync {args.command}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
