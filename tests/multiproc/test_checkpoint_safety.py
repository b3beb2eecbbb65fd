"""Checkpoint folders that other people and jobs can write to, read back by ``dssync train``
as a user runs it (a subprocess): a rank file that would run code is refused and nothing in
it runs, an index that names anything but its own ``step<k>`` folder is refused before any
rank reads or removes a file, saving never removes a link or what it points to, and a run
killed at random moments of its saves always resumes from the last complete checkpoint and
ends bit for bit where a run that never stopped ends.

Oracles: a marker file the planted object would create; a snapshot (names and bytes) of every
file outside the checkpoint folder taken before the run; the uninterrupted run, in a folder
of its own, for the killed one.
"""

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dssync.training.checkpoint import STEP_FOLDER, CheckpointError, read_state

pytestmark = pytest.mark.dist

DSSYNC = str(Path(sys.executable).parent / "dssync")


def train_args(steps: int) -> list[str]:
    return ["train", "--strategy", "ds-sync", "--task", "digits", "--nproc", "2", "--steps", str(steps),
            "--eval-every", str(steps), "--no-progress"]


TRAIN = train_args(40)
KILLED_STEPS = 30


def dssync(*args, cwd):
    return subprocess.run([DSSYNC, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)


def assert_one_line_error(proc, *needles):
    err = proc.stderr.strip()
    assert proc.returncode != 0, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def snapshot(root: Path, skip: Path) -> dict[str, str]:
    """Every file and link under ``root`` but outside ``skip``: its bytes' hash, or its target."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path == skip or skip in path.parents:
            continue
        if path.is_symlink():
            out[str(path)] = "-> " + os.readlink(path)
        elif path.is_file():
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[str(path)] = "dir"
    return out


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A checkpoint folder written by a run stopped at iteration 20 of 40."""
    where = tmp_path_factory.mktemp("stopped")
    proc = dssync(*TRAIN, "--checkpoint", "c", "--stop-after", "20", cwd=where)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((where / "c" / "latest.json").read_text())["folder"] == "step20"
    return where / "c"


@pytest.fixture
def layout(tmp_path, stopped):
    """``tmp/c`` (a copy of the stopped run's folder) beside ``tmp/victim``, a folder that
    looks like a step folder (rank files) and holds a file nobody may lose."""
    shutil.copytree(stopped, tmp_path / "c")
    victim = tmp_path / "victim"
    victim.mkdir()
    for r in range(4):
        shutil.copy(stopped / "step20" / "rank0.pt", victim / f"rank{r}.pt")
    (victim / "precious.txt").write_text("keep me\n")
    return tmp_path


class _RunsCode:
    """Pickles as a call of ``os.system``: what an attacker plants in a rank file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_rank_file_that_would_run_code_is_refused_and_nothing_in_it_runs(layout):
    rank0 = layout / "c" / "step20" / "rank0.pt"
    state = torch.load(rank0, weights_only=True)
    state["extra"] = _RunsCode(layout / "probe")
    torch.save(state, rank0)
    torch.load(rank0, weights_only=False)  # the payload is live: an unsafe reader runs it
    assert (layout / "probe").exists()
    state["extra"] = _RunsCode(layout / "pwned")
    torch.save(state, rank0)
    before = snapshot(layout, skip=layout / "nothing")

    proc = dssync(*TRAIN, "--checkpoint", "c", cwd=layout)

    assert_one_line_error(proc, str(Path("c") / "step20" / "rank0.pt"), "posix.system", "refused")
    assert not (layout / "pwned").exists()
    assert snapshot(layout, skip=layout / "nothing") == before  # the checkpoint itself is kept too


@pytest.mark.parametrize("damage", ["truncated", "empty", "missing", "a link"])
def test_a_damaged_rank_file_is_a_one_line_error_naming_it(layout, damage):
    rank1 = layout / "c" / "step20" / "rank1.pt"
    if damage == "truncated":
        rank1.write_bytes(rank1.read_bytes()[: rank1.stat().st_size // 2])
    elif damage == "empty":
        rank1.write_bytes(b"")
    elif damage == "missing":
        rank1.unlink()
    else:
        rank1.unlink()
        rank1.symlink_to(layout / "victim" / "rank1.pt")
    if damage == "a link":  # as a user runs it: the command's one-line error
        proc = dssync(*TRAIN, "--checkpoint", "c", cwd=layout)
        assert_one_line_error(proc, "rank 1", str(Path("c") / "step20" / "rank1.pt"))
    else:  # the same run in this process (the command prints this error's message; a subprocess
        # each costs three fresh imports of torch)
        message = _train_error(layout / "c")
        assert "rank 1" in message and str(layout / "c" / "step20" / "rank1.pt") in message, message
        assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert (layout / "victim" / "precious.txt").read_text() == "keep me\n"


def _train_error(checkpoint: Path, **settings) -> str:
    """The message of the error ``TRAIN`` (or ``settings`` instead of its steps) with
    ``--checkpoint checkpoint`` ends in, run in this process."""
    from dssync.errors import DssyncError
    from dssync.training.loop import TrainConfig, train

    config = {"steps": 40, "eval_every": 40, **settings}
    with pytest.raises(DssyncError) as err:
        train(TrainConfig(strategy="ds-sync", task="digits", checkpoint=str(checkpoint), **config), nproc=2)
    return str(err.value)


def _index(layout: Path, folder: str) -> None:
    latest = layout / "c" / "latest.json"
    meta = json.loads(latest.read_text())
    meta["folder"] = folder
    latest.write_text(json.dumps(meta))


@pytest.mark.parametrize("folder", ["../victim", "/abs", "step20/../../victim", "a link", "step7"])
def test_an_index_naming_another_folder_is_refused_before_anything_is_read_or_removed(layout, folder):
    c = layout / "c"
    if folder == "/abs":
        folder = str(layout / "victim")
    elif folder == "a link":  # the right name, but a link out of the checkpoint folder
        shutil.rmtree(c / "step20")
        (c / "step20").symlink_to(layout / "victim", target_is_directory=True)
        folder = "step20"
    elif folder == "step7":  # a real folder, with whole rank files, but not step 20's
        shutil.copytree(c / "step20", c / "step7")
    _index(layout, folder)
    outside = snapshot(layout, skip=c)
    inside = snapshot(c, skip=c / "nothing")

    if folder == "step20":  # the link, as a user runs it
        proc = dssync(*TRAIN, "--checkpoint", "c", cwd=layout)
        assert_one_line_error(proc, str(Path("c") / "latest.json"), "nothing was read or removed")
        assert "resuming" not in proc.stderr
    else:
        message = _train_error(c)
        assert str(c / "latest.json") in message and "nothing was read or removed" in message, message
    assert snapshot(layout, skip=c) == outside
    assert snapshot(c, skip=c / "nothing") == inside


def test_saving_removes_only_its_own_step_folders_never_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me\n")
    c = tmp_path / "c"
    c.mkdir()
    (c / "step3").symlink_to(victim, target_is_directory=True)  # a link with a step folder's name
    (c / "step2").write_text("a file, not a folder\n")
    (c / "notes").mkdir()
    (c / "stale7").mkdir()
    outside = snapshot(tmp_path, skip=c)

    proc = dssync(*train_args(8), "--checkpoint", "c", "--checkpoint-every", "4", cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in c.iterdir()) == ["latest.json", "notes", "stale7", "step2", "step3", "step8"]
    assert (c / "step3").is_symlink() and snapshot(tmp_path, skip=c) == outside

    d = tmp_path / "d"
    d.mkdir()
    (d / "step4").symlink_to(victim, target_is_directory=True)  # in the way of the save at step 4
    everything = snapshot(tmp_path, skip=tmp_path / "nothing")
    message = _train_error(d, steps=8, eval_every=8, checkpoint_every=4)  # in this process, as above
    assert "rank 0" in message and str(d / "step4") in message and "is in the way" in message, message
    assert snapshot(tmp_path, skip=tmp_path / "nothing") == everything


def test_read_state_refuses_a_file_that_is_not_a_state(tmp_path):
    path = tmp_path / "rank0.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match="holds a list, not a rank's state"):
        read_state(path)
    torch.save({"t": torch.ones(2), "plain": [1, "a", 2.5, None, (1, 2)]}, path)
    assert read_state(path)["plain"] == [1, "a", 2.5, None, (1, 2)]


# -- killed while saving -----------------------------------------------------------------------
KILLS = 4


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
        except OSError:
            pass
    return alive


def _committed(c: Path) -> int | None:
    """The step ``latest.json`` names, after checking that its folder holds every rank file."""
    latest = c / "latest.json"
    if not latest.exists():
        return None
    meta = json.loads(latest.read_text())
    assert meta["folder"] == f"step{meta['step']}"
    assert sorted(p.name for p in (c / meta["folder"]).iterdir()) == ["rank0.pt", "rank1.pt"]
    return meta["step"]


def _named(c: Path) -> int:
    """The step ``latest.json`` names now (0: none yet), read while a job may replace it."""
    try:
        return int(json.loads((c / "latest.json").read_text())["step"])
    except (OSError, ValueError):
        return 0


def _kill_during_a_save(cmd: list[str], cwd: Path, c: Path, rng: random.Random, log: Path) -> str:
    """Start ``cmd``, wait until its second or third save begins (the folder of that step
    appears), SIGKILL the parent a random moment later, and wait until no process of the job
    is left. Returns where in its saves the kill landed. Until the job's first save this polls
    slowly, to leave the cores to the job's start; then fast, and the job runs at a lower
    priority, so that this process sees the save while it is under way."""
    start = _committed(c) or 0
    due = start + rng.randint(2, 3)
    left = {p.name for p in c.iterdir()} if c.exists() else set()  # by the last kill: not this run's
    with open(log, "w") as err:
        proc = subprocess.Popen(["nice", "-n", "10", *cmd], cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 300  # a hang guard: a reniced job's start can take minutes on a loaded machine
    try:
        while True:
            assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before its save of step {due}"
            assert time.monotonic() < deadline, "no save began within 300 s"
            steps = [int(p.name[4:]) for p in c.iterdir() if STEP_FOLDER.fullmatch(p.name) and p.name not in left] \
                if c.exists() else []
            begun = max(max(steps, default=0), _named(c))
            if begun >= due:
                break
            time.sleep(0.0002 if begun > start else 0.02)
        job = _descendants(proc.pid)
        time.sleep(rng.uniform(0, 0.008))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    gone_by = time.monotonic() + 15
    while _alive(job) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert not _alive(job), f"processes of the killed job still run: {_alive(job)}"
    named = f"step{_named(c)}"
    folders = [p.name for p in c.iterdir() if STEP_FOLDER.fullmatch(p.name) and p.name != named]
    whole = [f for f in folders if sorted(x.name for x in (c / f).iterdir()) == ["rank0.pt", "rank1.pt"]]
    return "index not yet written" if any(int(f[4:]) > _named(c) for f in whole) else \
        "a rank file unwritten" if len(whole) < len(folders) else \
        "old folder not yet removed" if folders else "between saves"


def test_a_run_killed_during_its_saves_resumes_from_the_last_complete_one_bit_for_bit(tmp_path):
    rng = random.Random(34)
    cmd = [DSSYNC, *train_args(KILLED_STEPS), "--ensemble", "ema", "--lr-schedule", "cosine", "--warmup-steps", "3",
           "--checkpoint-every", "1"]
    whole = subprocess.run([*cmd, "--checkpoint", "whole"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr

    c, landed, committed = tmp_path / "killed", [], None
    for kill in range(KILLS):
        log = tmp_path / f"run{kill}.err"
        landed.append(_kill_during_a_save([*cmd, "--checkpoint", "killed"], tmp_path, c, rng, log))
        resumed = re.findall(r"resuming ds-sync at iteration (\d+)", log.read_text())
        assert resumed == ([] if committed is None else [str(committed)]), (kill, log.read_text())
        now = _committed(c)
        assert now is not None and (committed is None or now >= committed), (kill, committed, now)
        committed = now

    last = subprocess.run([*cmd, "--checkpoint", "killed", "--json", "last.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert last.returncode == 0, last.stderr
    assert json.loads((tmp_path / "last.json").read_text())["resumed_from"] == committed
    for r in range(2):
        a = torch.load(c / f"step{KILLED_STEPS}" / f"rank{r}.pt", weights_only=True)
        b = torch.load(tmp_path / "whole" / f"step{KILLED_STEPS}" / f"rank{r}.pt", weights_only=True)
        for part in ("model", "optimizer", "scheduler"):
            assert repr(a[part].keys()) == repr(b[part].keys())
        for name in a["model"]:
            assert torch.equal(a["model"][name], b["model"][name]), f"rank {r}: {name} differs after {KILLS} kills"
        for name in a["strategy"]["ensemble"]:
            assert torch.equal(a["strategy"]["ensemble"][name], b["strategy"]["ensemble"][name]), name
        assert a["strategy"]["shuffle"] == b["strategy"]["shuffle"]
    print(f"kills landed: {sorted((w, landed.count(w)) for w in set(landed))}; resumed from step {committed}")
