"""``DSSyncAverager`` (torch's ``ModelAverager`` interface) on real gloo worlds, against the
``ds-sync`` strategy of ``dssync train``: same seeds, same parameters on every rank, bit for
bit, with online regrouping and an ensemble on, and across a restart from its state_dict.

The oracle is ``dssync train``'s own final checkpoint: a different code path (the strategy's
flat parameter buffers, its loop, its checkpoint) for the same algorithm."""

import pytest
import torch
from ranks import averager_loop

from dssync.launch import run_ranks
from dssync.training.loop import TrainConfig, train

pytestmark = pytest.mark.dist


@pytest.mark.parametrize(("options", "resume_at"), [
    ({}, None),
    ({"adjust_every": 7, "ensemble": "ema"}, None),
    ({"adjust_every": 7, "ensemble": "ema"}, 16),
], ids=["plain", "regrouping+ema", "regrouping+ema, restarted at 16"])
def test_the_averager_computes_what_dssync_train_computes(tmp_path, options, resume_at):
    steps, seed = 30, 5
    strategy_options = {k: v for k, v in options.items()}
    train(TrainConfig(strategy="ds-sync", task="digits", steps=steps, seed=seed, eval_every=steps,
                      strategy_options=strategy_options, checkpoint=str(tmp_path)), nproc=4)
    got = run_ranks(averager_loop, "digits", steps, seed, options, resume_at, nproc=4)
    for r, (params, step, changes, final) in enumerate(got):
        want = torch.load(tmp_path / f"step{steps}" / f"rank{r}.pt", weights_only=True)
        assert step == steps
        for name, tensor in want["model"].items():
            assert torch.equal(params[name], tensor), f"rank {r}: {name}"
        strategy_changes = [(c["step"], c["reason"]) for c in want["strategy"]["shuffle"]["changes"]]
        assert changes == strategy_changes
        if "ensemble" in options:
            ema = {k.removeprefix("module."): v for k, v in want["strategy"]["ensemble"].items()}
            # final_model averages the ensemble over the world: the same on every rank
            assert torch.allclose(final["0.weight"], got[0][3]["0.weight"])
            assert not torch.equal(final["0.weight"], params["0.weight"])
            assert ema.keys() >= final.keys()
    assert not torch.equal(got[0][0]["0.weight"], got[1][0]["0.weight"])  # ds-sync's ranks differ


def test_the_averager_needs_a_process_group():
    from dssync import DSSyncAverager
    from dssync.errors import DssyncError

    with pytest.raises(DssyncError, match="init_process_group"):
        DSSyncAverager()
