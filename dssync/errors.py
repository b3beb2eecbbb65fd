"""Exception hierarchy. User input problems are ``ValueError`` subclasses so that callers
who do not know dssync still catch them; everything else derives from ``DssyncError``."""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "CommunicationError",
    "DssyncError",
    "ScheduleError",
    "TopologyError",
]


class DssyncError(Exception):
    """Root of every error dssync raises on purpose."""


class TopologyError(DssyncError, ValueError):
    """A topology file or object is malformed or inconsistent."""


class ScheduleError(DssyncError, ValueError):
    """A schedule file or object is malformed, inconsistent, or does not mix."""


class CommunicationError(DssyncError, RuntimeError):
    """A collective failed or timed out; the message names the rank and the group."""


class BackendUnavailableError(DssyncError, RuntimeError):
    """A requested communication backend is not installed or not usable here."""
