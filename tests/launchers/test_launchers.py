"""The same jobs under the launchers people use: torchrun, mpirun, horovodrun (--gloo, --mpi).

Each job checks every collective against an oracle computed from all ranks' seeded inputs
(``collective_job.py``), or trains ds-sync end to end and is compared across backends.
``make test`` installs mpi4py and builds Horovod (once, cached), so none of these skip.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.launchers

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
ROOT = ["--allow-run-as-root"] if os.geteuid() == 0 else []
CHECKS = 9


def _tool(name):
    path = shutil.which(name) or str(BIN / name)
    if not os.path.exists(path):
        pytest.fail(f"{name} is not installed; `make test` installs it (Horovod: python -m "
                    "dssync.launch.build_horovod)")
    return path


def launch(launcher, n, argv, timeout=300):
    if launcher == "torchrun":
        cmd = [_tool("torchrun"), "--nproc-per-node", str(n), "--master-port", str(_free_port()), *argv]
    elif launcher == "mpirun":
        cmd = [_tool("mpirun"), "-np", str(n), "--oversubscribe", *ROOT, sys.executable, *argv]
    else:  # horovodrun-gloo / horovodrun-mpi
        cmd = [_tool("horovodrun"), "-np", str(n), "-H", f"localhost:{n}", f"--{launcher.split('-')[1]}",
               sys.executable, *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)


def _free_port():
    from dssync.launch import free_port

    return free_port()


@pytest.mark.parametrize(("launcher", "backend"), [
    ("torchrun", "torch"), ("mpirun", "mpi"), ("horovodrun-gloo", "horovod"), ("horovodrun-mpi", "horovod"),
])
def test_every_collective_matches_the_oracle_under_the_launcher(launcher, backend, tmp_path):
    proc = launch(launcher, 4, [str(HERE / "collective_job.py"), "--backend", backend, "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    expected_launcher = {"torchrun": "torchrun", "mpirun": "mpirun"}.get(launcher, "horovodrun")
    for r, rec in enumerate(ranks):
        assert (rec["rank"], rec["world_size"], rec["backend"]) == (r, 4, backend)
        assert len(rec["checks"]) == CHECKS, rec["checks"]
        if launcher != "horovodrun-mpi":  # horovodrun --mpi also sets Open MPI's variables
            assert rec["launcher"] == expected_launcher


TRAIN = ["-m", "dssync.cli", "train", "--strategy", "ds-sync", "--task", "digits", "--steps", "60", "--seed", "7",
         "--no-progress"]


def test_ds_sync_trains_to_the_same_accuracy_on_every_backend(tmp_path):
    runs = {}
    gloo = subprocess.run([sys.executable, *TRAIN, "--nproc", "4", "--json", str(tmp_path / "torch.json")],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert gloo.returncode == 0, gloo.stderr[-3000:]
    runs["torch"] = json.loads((tmp_path / "torch.json").read_text())
    for launcher, backend in (("mpirun", "mpi"), ("horovodrun-gloo", "horovod")):
        out = tmp_path / f"{backend}.json"
        proc = launch(launcher, 4, [*TRAIN, "--backend", backend, "--json", str(out)], timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[backend] = json.loads(out.read_text())
    accuracy = {b: r["final_accuracy"] for b, r in runs.items()}
    assert all(r["world_size"] == 4 and r["steps"] == 60 for r in runs.values())
    assert accuracy["torch"] > 0.5, accuracy
    assert accuracy["mpi"] == pytest.approx(accuracy["torch"], abs=1e-6), accuracy
    assert accuracy["horovod"] == pytest.approx(accuracy["torch"], abs=1e-6), accuracy


def test_bench_allreduce_reports_busbw_for_every_backend_in_one_run(tmp_path):
    out = tmp_path / "ar.json"
    proc = subprocess.run([sys.executable, "-m", "dssync.cli", "bench", "allreduce", "--backend", "torch,mpi,horovod",
                           "--nproc", "4", "--sizes", "4K:64K", "--factor", "16", "--warmup", "1", "--iters", "3",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())["backends"]
    assert set(record) == {"torch", "mpi", "horovod"}
    for backend, rec in record.items():
        assert [r["size"] for r in rec["rows"]] == [4096, 65536], backend
        assert all(r["wrong"] == 0 and r["busbw_gbs"] > 0 for r in rec["rows"]), backend
        assert f"backend {backend}" in proc.stdout
    assert "# busbw at the largest size: torch" in proc.stdout


def test_a_backend_that_is_not_installed_names_the_extra(tmp_path):
    probe = ("import sys; sys.modules['{mod}'] = None\n"
             "from dssync.collectives.{adapter} import {fn}\n"
             "try:\n    {fn}()\nexcept Exception as e:\n    print(e)")
    mpi = subprocess.run([sys.executable, "-c", probe.format(mod="mpi4py", adapter="mpi", fn="import_mpi")],
                         capture_output=True, text=True, timeout=120)
    assert "pip install 'dssync[mpi]'" in mpi.stdout, mpi.stdout + mpi.stderr
    hvd = subprocess.run([sys.executable, "-c", probe.format(mod="horovod", adapter="horovod", fn="import_horovod")],
                         capture_output=True, text=True, timeout=120)
    assert "python -m dssync.launch.build_horovod" in hvd.stdout, hvd.stdout + hvd.stderr


def test_mpi_and_horovod_backends_refuse_to_run_without_their_launcher():
    proc = subprocess.run([sys.executable, *TRAIN, "--backend", "mpi", "--nproc", "2"], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "mpirun -np N" in proc.stderr, proc.stderr


# One strategy per kind of communication a backend must carry: the world's allreduce, the
# racks' subgroups (hierarchical), pairs (gossip) and the parameter server's point-to-point
# (asp). local-sgd is allreduce at a period and ssp asp's server with a bound: nothing new
# for the backend.
@pytest.mark.parametrize(("launcher", "backend", "strategies"), [
    ("mpirun", "mpi", ["allreduce", "hierarchical", "gossip", "asp"]),
    ("horovodrun-gloo", "horovod", ["allreduce", "hierarchical", "gossip", "asp"]),
])
def test_every_strategy_trains_under_the_launcher(launcher, backend, strategies, tmp_path):
    accuracy = {}
    for strategy in strategies:
        out = tmp_path / f"{strategy}.json"
        argv = ["-m", "dssync.cli", "train", "--strategy", strategy, "--task", "digits", "--steps", "30",
                "--eval-every", "30", "--no-progress", "--backend", backend, "--json", str(out)]
        proc = launch(launcher, 4, argv)
        assert proc.returncode == 0, (strategy, proc.stdout[-2000:] + proc.stderr[-2000:])
        record = json.loads(out.read_text())
        assert (record["backend"], record["world_size"]) == (backend, 4)
        accuracy[strategy] = record["final_accuracy"]
    assert min(accuracy.values()) > 0.5, accuracy  # ten classes: chance is 0.1
    # Oracle: hierarchical's three stages sum exactly allreduce's gradient.
    assert accuracy["hierarchical"] == pytest.approx(accuracy["allreduce"], abs=1e-6), accuracy


def test_the_two_line_ddp_example_computes_what_dssync_train_computes(tmp_path):
    """examples/ddp_mnist.py (PyTorch's DDP MNIST script plus two lines) under torchrun at 4
    ranks: every rank's parameters after k steps equal, bit for bit, those of
    ``dssync train --strategy ds-sync`` on the same seed (its final checkpoint)."""
    from dssync.training.loop import TrainConfig, train

    steps = 40
    (tmp_path / "example").mkdir()
    proc = launch("torchrun", 4, [str(HERE.parents[1] / "examples" / "ddp_mnist.py"), "--steps", str(steps),
                                  "--seed", "2", "--save", str(tmp_path / "example")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{steps} steps on 4 ranks: test accuracy" in proc.stdout
    train(TrainConfig(strategy="ds-sync", task="mnist", steps=steps, seed=2, eval_every=steps,
                      checkpoint=str(tmp_path / "train")), nproc=4)
    models = []
    for r in range(4):
        got = torch.load(tmp_path / "example" / f"rank{r}.pt", weights_only=True)
        want = torch.load(tmp_path / "train" / f"step{steps}" / f"rank{r}.pt", weights_only=True)["model"]
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), f"rank {r}: {name}"
        models.append(got)
    assert not torch.equal(models[0]["0.weight"], models[1]["0.weight"])  # the ranks' models differ


@pytest.mark.parametrize(("launcher", "library"), [("mpirun", "mpi"), ("horovodrun-gloo", "horovod")])
def test_the_probe_runs_as_typed_under_mpirun_and_horovodrun(launcher, library, tmp_path):
    """`mpirun -np 4 dssync probe --out t.json` with no flag or variable: the probe runs
    over the launcher's own library and measures every path."""
    out = tmp_path / "t.json"
    proc = launch(launcher, 4, [str(BIN / "dssync"), "probe", "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    topo = json.loads(out.read_text())
    assert len(topo["workers"]) == 4 and topo["probe"]["library"] == library
    for name in ("latency_us", "bandwidth_gbps"):
        matrix = torch.tensor(topo[name])
        off_diagonal = matrix[~torch.eye(4, dtype=torch.bool)]
        assert bool((off_diagonal > 0).all()), (name, topo[name])


def test_ds_sync_under_mpirun_probes_when_its_ranks_are_on_several_hosts(tmp_path):
    """--backend mpi probes first as --backend torch does: each rank names its own host
    (DSSYNC_HOST), so ds-sync measures the network before it plans."""
    out = tmp_path / "mpi.json"
    argv = ["-c", f"import os, sys; os.environ['DSSYNC_HOST'] = 'h' + os.environ['OMPI_COMM_WORLD_RANK']; "
            f"from dssync.cli import main; sys.exit(main({[*TRAIN[2:], '--steps', '10', '--eval-every', '10', '--backend', 'mpi', '--json', str(out)]!r}))"]
    proc = launch("mpirun", 4, argv, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["backend"] == "mpi" and sorted(sum(record["topology"]["racks"], [])) == [0, 1, 2, 3]
    assert record["topology"]["probe"]["library"] == "mpi", record["topology"]
