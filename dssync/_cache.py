"""Where dssync keeps what it builds or computes once per machine: ``$DSSYNC_CACHE``,
default ``~/.cache/dssync`` (the Horovod wheel, the digits split)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    return Path(os.environ.get("DSSYNC_CACHE", Path.home() / ".cache" / "dssync"))
