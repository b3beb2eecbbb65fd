"""The order in which a parameter-server worker pushes to the shards."""

from hypothesis import given
from hypothesis import strategies as st

from dssync.ps.links import push_order


@given(st.integers(min_value=1, max_value=64))
def test_workers_pushing_at_once_send_to_different_shards_at_every_step(n):
    orders = [push_order(rank, n) for rank in range(n)]
    for rank, order in enumerate(orders):
        assert sorted(order) == list(range(n))  # every shard once
        assert order[-1] == rank  # its own shard, which crosses no NIC, last
    for k in range(n):
        assert len({order[k] for order in orders}) == n  # no two workers into one shard at once
