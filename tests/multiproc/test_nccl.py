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
