"""Reading and writing the versioned JSON contracts (topology.json, schedule.json)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = ["MAX_BYTES", "check_writable", "is_whole", "read_versioned", "sync_folder", "write_json"]

#: The largest contract file read (a topology of 100,000 workers with its matrices is far less).
MAX_BYTES = 256 * 2**20


def read_versioned(
    path: str | os.PathLike[str], *, kind: str, version: int | tuple[int, ...], error: type[Exception]
) -> dict[str, Any]:
    """Load a JSON object from ``path`` and check its ``"version"``.

    Every failure (missing file, bad JSON, wrong top-level type, wrong version) raises
    ``error`` with a one-line message that names the file and the fix.
    """
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block, /dev/zero never end
            raise error(f"{kind} file {path} is not a regular file")
        if info.st_size > MAX_BYTES:
            raise error(f"{kind} file {path} has {info.st_size} bytes, over the limit of {MAX_BYTES}")
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{kind} file {path} does not exist") from None
    except UnicodeDecodeError:
        raise error(f"{kind} file {path} is not UTF-8 text") from None
    except OSError as exc:
        raise error(f"cannot read {kind} file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise error(
            f"{kind} file {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg})"
        ) from None
    except ValueError as exc:
        raise error(f"{kind} file {path}: {exc}") from None
    except RecursionError:
        raise error(f"{kind} file {path} nests too deeply to be a {kind}") from None
    if not isinstance(data, dict):
        raise error(f"{kind} file {path} must hold a JSON object, found {type(data).__name__}")
    found = data.get("version")
    versions = version if isinstance(version, tuple) else (version,)
    if found not in versions or isinstance(found, bool):
        raise error(
            f'{kind} file {path} has "version": {found!r}; this dssync reads version '
            f'{" or ".join(map(str, versions))}'
        )
    return data


def write_json(path: str | os.PathLike[str], data: Any, *, durable: bool = False) -> None:
    """Write ``data`` as indented, strict JSON (no NaN or Infinity, which strict parsers
    reject: ``ValueError`` instead), atomically (write a sibling, then rename). ``durable``:
    also flush the file and its folder to the disk, so that a crash of the host leaves either
    the old file or the whole new one."""
    path = Path(path)
    text = json.dumps(data, indent=1, allow_nan=False) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            sync_folder(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def sync_folder(path: str | os.PathLike[str]) -> None:
    """Flush the names just created or renamed in the folder ``path`` to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number as JSON and plain-data state carry one (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number strict JSON allows")


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise ``OSError`` with a one-line reason unless ``write_json(path, ...)`` can succeed:
    its folder exists and takes new files, and ``path`` is not a folder or other non-file.
    For outputs written at the end of long work, checked before the work starts."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise OSError(f"cannot write {path}: the folder {folder} does not exist")
    if path.exists() and not path.is_file():
        raise OSError(f"cannot write {path}: it exists and is not a regular file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OSError(f"cannot write {path}: the folder {folder} is not writable")
