"""Numbers and switches read from what a user typed (flags, ``--set``, variants): one reader
each, shared by the command line and the typed configs."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["parse_variant", "read_bool", "read_finite", "read_settings"]


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


_READERS: dict[type, Callable[[str], Any]] = {bool: read_bool, int: int, float: read_finite, str: str}


def read_settings(cls: type, pairs: Sequence[str], owner: str, flag: str = "--set",
                  form: str = "KEY=VALUE") -> dict[str, Any]:
    """``["key=value", ...]`` as settings of the dataclass ``cls``, each value read as its field's
    type (``typing.get_type_hints``; bool: true/false/1/0, float: finite). Only fields of those
    plain types can be set; an unknown key or a bad value is a ``ValueError`` naming the choices
    (``flag`` and ``form`` are how the user writes them)."""
    types = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init and types.get(f.name) in _READERS}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or key not in names:
            raise ValueError(f"{flag} {pair!r}: {owner} has the settings "
                             f"{', '.join(sorted(names)) or '(none)'}; write {form}")
        kind = types[key]
        try:
            out[key] = _READERS[kind](text)
        except ValueError:
            raise ValueError(f"{flag} {pair!r}: {key} must be of type {kind.__name__}"
                             f"{' (a finite number)' if kind is float else ''}") from None
    return out


def parse_variant(spec: str) -> tuple[str, list[str]]:
    """``"psp:push_quorum=3:pull_fraction=0.75"`` -> ``("psp", ["push_quorum=3", "pull_fraction=0.75"])``:
    a strategy and its settings, so one comparison can hold several settings of one strategy
    side by side (its records keep the whole spec as ``strategy``). A setting that starts with
    ``--`` is an option of the run's ``dssync train`` (``bench.compare.split_settings``)."""
    name, *settings = [part.strip() for part in spec.split(":")]
    return name, [kv for kv in settings if kv]
