import torch

from dssync.tasks import build_task


def test_digits_split_and_shards_are_disjoint_and_complete():
    task = build_task("digits")
    assert len(task.train_x) + len(task.test_x) == 1797
    shards = [task.shard(r, 8) for r in range(8)]
    assert sum(len(x) for x, _ in shards) == len(task.train_x)
    batches = task.batches(3, 8, 16, seed=0)
    x, y = next(batches)
    assert x.shape == (16, 64) and y.shape == (16,)


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
