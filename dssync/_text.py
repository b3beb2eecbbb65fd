"""Numbers and switches read from what a user typed (flags, ``--set``, variants): one reader
each, shared by the command line and the typed configs."""

from __future__ import annotations

import math

__all__ = ["read_bool", "read_finite"]


def read_finite(text: str) -> float:
    """A finite number; ``ValueError`` saying why not (``nan`` and ``inf`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def read_bool(text: str) -> bool:
    """``true``/``false``/``1``/``0`` (any case); ``ValueError`` otherwise."""
    if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"{text!r} is not true, false, 1 or 0")
    return text.lower() in ("true", "1")
