"""Build Horovod 0.28.1 for the installed torch, once, and install it from a cached wheel.

Horovod 0.28.1 is Horovod's last release; its CMake files ask for C++14, and torch 2.x
headers need C++17. This script downloads the sdist from the package index, sets
``CMAKE_CXX_STANDARD`` to 17 in ``CMakeLists.txt`` and ``horovod/torch/CMakeLists.txt``,
builds a wheel with the Gloo and MPI controllers and the PyTorch framework only, against
the torch already in this environment (``--no-build-isolation``), and keeps the wheel in
``$DSSYNC_CACHE/wheels/torch-<version>-<python>/`` (default ``~/.cache/dssync``), outside any
checkout. Later runs install that wheel in seconds; a different torch or Python builds a
new one. The build takes about 15 minutes on 2 cores.

    python -m dssync.launch.build_horovod            # build if needed, then install
    python -m dssync.launch.build_horovod --check    # exit 0 when horovod.torch imports
    python -m dssync.launch.build_horovod --print-dir

The install goes through pip with the cache folder as ``--find-links``, so the extra
``pip install 'dssync[horovod]' --find-links "$(python -m dssync.launch.build_horovod
--print-dir)"`` resolves ``horovod==0.28.1`` to the cached wheel, and Horovod's own
dependencies come from the index.

Needs a C++ compiler, CMake 3.13 or newer, and MPI headers (``libopenmpi-dev``); the
Makefile installs the latter.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

from dssync._cache import cache_root

__all__ = ["main", "patch_cxx17", "wheel_dir"]

HOROVOD = "horovod==0.28.1"
CMAKE_FILES = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")
BUILD_ENV = {
    "HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_MPI": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1",
}


def cache_dir() -> Path:
    return cache_root() / "wheels"


def _torch_version() -> str:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("build_horovod: torch is not importable here; install torch first "
                         "(the Makefile pins torch==2.13.0)")
    return out.stdout.strip()


def wheel_dir(torch_version: str) -> Path:
    """The folder that holds the wheel built for this torch, this Python and this platform."""
    key = re.sub(r"[^0-9A-Za-z.]+", "_", torch_version)
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return cache_dir() / f"torch-{key}-cp{sys.version_info.major}{sys.version_info.minor}-{platform}"


def cached(folder: Path) -> Path | None:
    wheels = sorted(folder.glob("horovod-0.28.1-*.whl"))
    return wheels[-1] if wheels else None


def patch_cxx17(source: Path) -> None:
    """``set(CMAKE_CXX_STANDARD 14)`` becomes 17 in Horovod's two CMake files; an sdist
    that does not carry that line is refused rather than built with the wrong standard."""
    for rel in CMAKE_FILES:
        path = source / rel
        text = path.read_text()
        patched, count = re.subn(r"set\(CMAKE_CXX_STANDARD\s+14\)", "set(CMAKE_CXX_STANDARD 17)", text)
        if count == 0 and "set(CMAKE_CXX_STANDARD 17)" not in text:
            raise SystemExit(f"build_horovod: {rel} has no `set(CMAKE_CXX_STANDARD 14)` to raise to 17; "
                             "this script knows Horovod 0.28.1's sources only")
        path.write_text(patched)


def _run(argv: list[str], **kwargs) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True, **kwargs)


def build(folder: Path) -> Path:
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"build_horovod: `{tool}` is not on PATH; Horovod builds with CMake and a C++ "
                             "compiler (apt-get install cmake g++)")
    with tempfile.TemporaryDirectory(prefix="horovod-build-") as tmp:
        work = Path(tmp)
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
              "-d", str(work), HOROVOD])
        (sdist,) = work.glob("horovod-0.28.1.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        source = work / "horovod-0.28.1"
        patch_cxx17(source)
        env = {**os.environ, **BUILD_ENV, "MAKEFLAGS": f"-j{os.cpu_count() or 1}"}
        out = work / "dist"
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
              str(source)], env=env)
        (built,) = out.glob("horovod-*.whl")
        folder.mkdir(parents=True, exist_ok=True)
        wheel = folder / built.name
        shutil.copy2(built, folder / (built.name + ".part"))  # a half-copied wheel never looks cached
        os.replace(folder / (built.name + ".part"), wheel)
    print(f"build_horovod: cached {wheel}", flush=True)
    return wheel


def importable() -> bool:
    probe = "import horovod.torch as hvd; assert hvd.gloo_built() and hvd.mpi_built()"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dssync.launch.build_horovod", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only report whether horovod.torch imports")
    p.add_argument("--rebuild", action="store_true", help="build even if a cached wheel exists")
    p.add_argument("--print-dir", action="store_true", help="print the cache folder for this torch and exit")
    args = p.parse_args(argv)
    if args.check:
        ok = importable()
        print("horovod.torch: " + ("importable, with Gloo and MPI" if ok else "not importable"))
        return 0 if ok else 1
    folder = wheel_dir(_torch_version())
    if args.print_dir:
        print(folder)
        return 0
    wheel = cached(folder)
    if args.rebuild or wheel is None:
        wheel = build(folder)
    elif importable():
        print(f"build_horovod: horovod already installed (cached wheel {wheel})")
        return 0
    # The cached wheel, never the sdist; Horovod's own dependencies from the index; the
    # installed torch stays.
    _run([sys.executable, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel)])
    _run([sys.executable, "-m", "pip", "install", "-q", "--find-links", str(folder), "--only-binary", "horovod",
          "horovod==0.28.1"])
    if not importable():
        raise SystemExit("build_horovod: installed the wheel but `import horovod.torch` fails or lacks "
                         f"Gloo/MPI; rebuild with --rebuild (wheel: {wheel})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
