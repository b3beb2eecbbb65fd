"""The NCCL path of the torch communicator, on a machine with a CUDA GPU.

CUDA tensors go through NCCL (native AVG), CPU tensors through gloo, in the one world that
``init_process_group`` builds with ``"cpu:gloo,cuda:nccl"``. NCCL refuses two ranks on
one GPU, so the world has one rank per visible GPU; on a machine without CUDA the tests
skip with that reason (the gloo path is covered by ``test_gloo.py``).
"""

import pytest
import torch
from ranks import nccl_smoke

from dssync.launch import run_ranks

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="the NCCL path needs a CUDA GPU"),
]


def test_cuda_and_cpu_tensors_share_one_world():
    world = torch.cuda.device_count()
    out = run_ranks(nccl_smoke, nproc=world, timeout_s=120)
    for rank, result in enumerate(out):
        assert result["backend"] == "cpu:gloo,cuda:nccl"
        assert result["device"] == f"cuda:{rank}"
        # Oracle: rank r starts from r + 1 (CUDA) and 10 (r + 1) (CPU).
        mean = (world + 1) / 2
        assert result["cuda_avg"] == pytest.approx([mean] * 4)
        assert result["cpu_avg"] == pytest.approx([10 * mean] * 4)
        assert result["cuda_bcast"] == [7.0] * 3
        assert result["gathered"] == list(range(world))
        assert result["ds_sync_params_on"] == f"cuda:{rank}"


@pytest.mark.parametrize("strategy", ["ds-sync", "allreduce", "ddp"])
def test_dssync_train_on_cuda_trains_every_rank_on_its_gpu(strategy, tmp_path):
    from dssync.training.loop import TrainConfig, train

    world = min(torch.cuda.device_count(), 4)
    record = train(TrainConfig(strategy=strategy, task="digits", steps=120, eval_every=60, device="cuda",
                               checkpoint=str(tmp_path)), nproc=world)
    assert record["final_accuracy"] > 0.7  # chance 0.1; the CPU runs reach 0.85-0.95
    state = torch.load(tmp_path / "step120" / "rank0.pt", weights_only=True)
    assert all(t.is_cuda for t in state["model"].values())


def test_the_averager_on_cuda_computes_what_dssync_train_computes(tmp_path):
    from ranks import averager_loop

    from dssync.training.loop import TrainConfig, train

    world = min(torch.cuda.device_count(), 4)
    train(TrainConfig(strategy="ds-sync", task="digits", steps=30, seed=5, eval_every=30, device="cuda",
                      checkpoint=str(tmp_path)), nproc=world)
    got = run_ranks(averager_loop, "digits", 30, 5, {}, 16, "cuda", nproc=world)
    for r, (params, *_rest) in enumerate(got):
        want = torch.load(tmp_path / "step30" / f"rank{r}.pt", weights_only=True)["model"]
        for name, tensor in want.items():
            assert params[name].is_cuda
            torch.testing.assert_close(params[name], tensor, rtol=1e-6, atol=1e-7)
