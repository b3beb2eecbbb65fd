"""The simulator against closed forms worked out by hand (and the paper's Table II)."""

import numpy as np
import pytest

from dssync.bench.simulate import Network, iteration_times, rank_times, simulate, table_ii

B = 125e6  # 1 Gbit/s in bytes/s
S = 1e6
ALPHA = 1e-4


def test_ring_allreduce_on_clear_links_is_the_alpha_beta_formula_and_table_ii():
    net = Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=ALPHA)
    n = 8
    want = 2 * (n - 1) * (ALPHA + S / n / B)
    assert iteration_times(net, "allreduce", S, 3) == pytest.approx(np.full(3, want))
    ring = table_ii(workers=8, racks=2, size_bytes=S, alpha_s=ALPHA, beta1_s=1 / B, beta2_s=1 / B)["ring"]
    assert ring == pytest.approx(want)


def test_background_streams_take_their_tcp_share_of_the_uplink():
    net = Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=ALPHA, uplink_out_streams={0: 8})
    # The ring's one flow out of rack 0 shares its uplink with 8 streams: 1/9 of it.
    want = 2 * 7 * (ALPHA + S / 8 / (B / 9))
    assert iteration_times(net, "allreduce", S, 1)[0] == pytest.approx(want)


def test_gossip_cycles_through_the_exponential_graph_and_pays_for_shared_uplinks():
    net = Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=ALPHA)
    times = iteration_times(net, "gossip", S, 6)
    # Offsets 1, 2, 4 send 1, 2 and 4 flows out of each rack through its uplink.
    assert times == pytest.approx([ALPHA + S / B, ALPHA + S / (B / 2), ALPHA + S / (B / 4)] * 2)


def test_ds_sync_rounds_respect_the_lower_bound_and_beat_allreduce_under_contention():
    net = Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=0.0, uplink_out_streams={0: 8})
    times = iteration_times(net, "ds-sync", S, 8)
    # Every round has a cross-rack pair through the contended uplink: at best S bytes at B/9
    # (DESIGN section 7: 2(n-1)/n * S / B with n = 2).
    assert np.all(times >= S / (B / 9) - 1e-12)
    out = simulate(net, ["allreduce", "ds-sync"], size_bytes=S, iterations=8)
    assert out["allreduce"]["median_ms"] > out["ds-sync"]["median_ms"]


def test_parameter_server_moves_every_shard_both_ways():
    net = Network((2,), nic_bps=B, uplink_bps=B, alpha_s=0.0)
    # Two workers, two shards: each sends S/2 to the other shard and receives S/2 back.
    assert iteration_times(net, "asp", S, 1)[0] == pytest.approx(2 * (S / 2) / B)


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        iteration_times(Network((2, 2)), "nope", S, 1)


def test_the_simulator_models_each_emulated_scenario_with_its_background_streams():
    from dssync.bench.simcheck import markdown_table, network_of
    from dssync.launch.emulate import FLOW_STREAMS

    static, inter, nic = (network_of(s, alpha_s=ALPHA) for s in ("static", "inter-rack", "inter-rack+nic"))
    assert (static.rack_sizes, static.uplink_out_streams, static.nic_out_streams) == ((4, 4), {}, {})
    assert (inter.rack_sizes, inter.uplink_out_streams, inter.nic_out_streams) == ((4, 4), {0: FLOW_STREAMS}, {})
    assert (nic.rack_sizes, nic.uplink_out_streams, nic.nic_out_streams) == ((5, 3), {}, {4: FLOW_STREAMS})
    assert static.nic_bps == static.uplink_bps == 125e6
    quarter = network_of("inter-rack", alpha_s=ALPHA, rate_scale=0.25)
    assert quarter.nic_bps == quarter.uplink_bps == 125e6 / 4
    assert quarter.uplink_out_streams == inter.uplink_out_streams
    with pytest.raises(ValueError, match="rate_scale must be positive"):
        network_of("static", alpha_s=ALPHA, rate_scale=0)
    row = {"scenario": "static", "strategy": "gossip", "measured_ms": 10.0, "predicted_ms": 8.0, "ratio": 0.8}
    assert markdown_table([row]).splitlines()[-1] == "| static | gossip | 10.0 | 8.0 | 0.80 |"


def test_the_hosting_machine_caps_a_step_by_the_veth_bytes_it_moves():
    # A 1 Gbit/s ring on a machine that moves 0.5 GB of veth-bytes a second: each step's
    # 8 flows carry S/8, six inside a rack (two veths) and two between racks (four).
    host = 0.5e9
    net = Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=ALPHA, host_bps=host)
    step = (6 * 2 + 2 * 4) * (S / 8) / host
    assert step > S / 8 / B  # the machine, not the links, is the limit here
    assert iteration_times(net, "allreduce", S, 1)[0] == pytest.approx(2 * 7 * (ALPHA + step))
    # A background flow (three veths at its link's rate) leaves the job the rest.
    busy = Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=ALPHA, host_bps=host, uplink_out_streams={0: 8})
    step = (6 * 2 + 2 * 4) * (S / 8) / (host - 3 * B)
    assert iteration_times(busy, "allreduce", S, 1)[0] == pytest.approx(2 * 7 * (ALPHA + max(step, S / 8 / (B / 9))))
    # Uncapped (a real cluster) nothing changes.
    assert iteration_times(Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=ALPHA), "allreduce", S, 1)[0] == \
        pytest.approx(2 * 7 * (ALPHA + S / 8 / B))


def test_hierarchical_follows_gloos_reduce_and_broadcast():
    """gloo's reduce: ring reduce-scatter, then n - 1 shares into the root's NIC; its
    broadcast: a binomial tree whose root posts all its whole-buffer sends at once."""
    net = Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=0.0)
    t = S / B
    # reduce 1.5 t (0.75 scatter + 3 quarters into the root), leaders' pair 1 t,
    # broadcast 3 t (root -> 1 and 2 sharing its NIC: 2 t; then 1 -> 3: t).
    assert iteration_times(net, "hierarchical", S, 1)[0] == pytest.approx(5.5 * t)
    # Five ranks (dim 3): the root's three sends share its NIC (3 t), then 1 -> 3 (t).
    five = Network((5, 3), nic_bps=B, uplink_bps=B, alpha_s=0.0)
    reduce5 = 4 / 5 * t + 4 / 5 * t  # scatter (n-1)/n, gather (n-1)/n into the root
    assert iteration_times(five, "hierarchical", S, 1)[0] == pytest.approx(reduce5 + t + 4 * t)


def test_ds_sync_ranks_wait_for_group_mates_still_in_a_slower_group():
    """Each rank keeps its own clock. Static plan on 4 + 4: the cross-rack pair takes
    t = S/B, the intra-rack groups of three 4/3 t. The pair's members leave early and, next
    round, wait 1/3 t in their new group of three for members of the last one."""
    net = Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=0.0)
    t = S / B
    ranks = rank_times(net, "ds-sync", S, 3)
    assert ranks[0] == pytest.approx([t, 4 / 3 * t, 4 / 3 * t, 4 / 3 * t, t, 4 / 3 * t, 4 / 3 * t, 4 / 3 * t])
    assert ranks[1, 0] == pytest.approx(5 / 3 * t)  # rank 0, last round's representative
    assert iteration_times(net, "ds-sync", S, 3) == pytest.approx([4 / 3 * t, 5 / 3 * t, 5 / 3 * t])


def test_gossip_has_no_barrier_so_a_slow_sender_delays_its_peers_next_iteration():
    """One rack of 4; rank 0's NIC carries 3 background streams, so 0 -> 1 moves at B/4 (4 t)
    while every other transfer takes t. Iteration 1 (offset 2): 0 -> 2 starts only when rank
    0 is back, at 4 t, and ends at 8 t; rank 2, free since t, has spent 7 t."""
    net = Network((4,), nic_bps=B, uplink_bps=B, alpha_s=0.0, nic_out_streams={0: 3})
    t = S / B
    ranks = rank_times(net, "gossip", S, 2)
    assert ranks[0] == pytest.approx([4 * t, 4 * t, t, t])
    assert ranks[1] == pytest.approx([4 * t, t, 7 * t, 4 * t])
    assert iteration_times(net, "gossip", S, 2) == pytest.approx([4 * t, 7 * t])


def test_lockstep_strategies_spend_the_same_time_on_every_rank():
    net = Network((4, 4), nic_bps=B, uplink_bps=B, alpha_s=ALPHA, uplink_out_streams={0: 8})
    for strategy in ("allreduce", "hierarchical", "asp"):
        ranks = rank_times(net, strategy, S, 4)
        assert ranks.shape == (4, 8) and np.all(ranks == ranks[0, 0]) and ranks[0, 0] > 0
    out = simulate(net, ["allreduce", "ds-sync"], size_bytes=S, iterations=12)
    assert out["allreduce"]["per_rank_ms"] == pytest.approx(out["allreduce"]["mean_ms"])
    # ds-sync's ranks spend less on average than the slowest of them each iteration.
    assert out["ds-sync"]["per_rank_ms"] < out["ds-sync"]["mean_ms"]
