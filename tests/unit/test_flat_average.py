"""The one averaging path (``dssync.averaging.flat``) on the in-process fake world, against
means computed here tensor by tensor."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dssync.averaging.flat import average_tensors, flatten_parameters, world_average
from dssync.collectives import FakeWorld

DTYPES = (torch.float32, torch.float64)


def _tensors(rank: int, shapes: list[tuple[int, ...]], kinds: list[int], transpose: list[bool]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + rank)
    out = []
    for shape, kind, flip in zip(shapes, kinds, transpose, strict=True):
        t = torch.randn(shape, generator=gen, dtype=DTYPES[kind])
        out.append(t.t() if flip and t.dim() == 2 else t)  # a transposed view is not contiguous
    return out


@settings(max_examples=12, deadline=None)
@given(
    layout=st.lists(st.tuples(st.lists(st.integers(1, 4), min_size=1, max_size=2), st.integers(0, 1), st.booleans()),
                    min_size=1, max_size=5),
    split=st.integers(1, 3),
)
def test_each_tensor_becomes_its_groups_mean_of_it(layout, split):
    shapes = [tuple(s) for s, _, _ in layout]
    kinds = [k for _, k, _ in layout]
    flips = [f for _, _, f in layout]
    groups = [tuple(range(split)), tuple(range(split, 4))]
    initial = [_tensors(r, shapes, kinds, flips) for r in range(4)]

    def body(comm):
        comm.register_groups(groups)
        mine = _tensors(comm.rank, shapes, kinds, flips)
        group = next(g for g in groups if comm.rank in g)
        sent = average_tensors(comm, mine, group)
        return group, mine, sent

    for group, mine, sent in FakeWorld(4).run(body):
        for i, t in enumerate(mine):
            expected = sum(initial[r][i] for r in group) / len(group)
            torch.testing.assert_close(t, expected, rtol=0, atol=1e-6)
            assert t.dtype == DTYPES[kinds[i]] and t.shape == initial[0][i].shape
        assert sent == sum(t.numel() * t.element_size() for t in mine)


def test_flat_buffers_are_averaged_in_place_and_the_parameters_see_it():
    def body(comm):
        gen = torch.Generator().manual_seed(comm.rank)
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2).double())
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
        before = [p.detach().clone() for p in model.parameters()]
        flats = flatten_parameters(model)
        pointers = [f.data_ptr() for f in flats]
        average_tensors(comm, flats)
        return before, [p.detach().clone() for p in model.parameters()], pointers, [f.data_ptr() for f in flats]

    out = FakeWorld(3).run(body)
    for _, after, pointers, now in out:
        assert pointers == now
        for i, p in enumerate(after):
            torch.testing.assert_close(p, sum(o[0][i] for o in out) / 3, rtol=0, atol=1e-6)


def test_world_average_averages_float_buffers_and_leaves_the_module_alone():
    def body(comm):
        model = nn.BatchNorm1d(3)
        with torch.no_grad():
            model.weight.fill_(comm.rank)
            model.running_mean.fill_(2.0 * comm.rank)
        model.num_batches_tracked.fill_(comm.rank)
        averaged = world_average(comm, model)
        return comm.rank, model, averaged

    for rank, model, averaged in FakeWorld(4).run(body):
        torch.testing.assert_close(averaged.weight.detach(), torch.full((3,), 1.5))
        torch.testing.assert_close(averaged.running_mean, torch.full((3,), 3.0))
        assert int(averaged.num_batches_tracked) == int(model.num_batches_tracked)  # integers are not averaged
        torch.testing.assert_close(model.weight.detach(), torch.full((3,), float(rank)))
