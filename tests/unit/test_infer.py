"""Rack inference and contention classification, on synthetic matrices with known answers
and on matrices recorded from the emulated cluster."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dssync.topology.contention import classify_contention, fan_clears, nic_suspects, unsure_flags
from dssync.topology.matrices import clear_latency, queued_ranks, renumber_racks
from dssync.topology.placement import (
    RackFit,
    filled,
    held,
    place_behind_standing_queue,
    place_blind,
    split_across_queues,
)
from dssync.topology.racks import fit_racks, infer_racks


def matrices(racks, *, intra_gbps=1.0, inter_gbps=0.25, intra_us=30.0, inter_us=200.0,
             noise=0.0, seed=0):
    """Latency and bandwidth for ranks in ``racks`` (rack per rank), with +-``noise`` jitter."""
    racks = np.asarray(racks)
    same = np.equal.outer(racks, racks)
    lat = np.where(same, intra_us, inter_us).astype(float)
    bw = np.where(same, intra_gbps, inter_gbps).astype(float)
    rng = np.random.default_rng(seed)
    lat *= rng.uniform(1 - noise, 1 + noise, lat.shape)
    bw *= rng.uniform(1 - noise, 1 + noise, bw.shape)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, 0.0)
    return lat, bw


def layout(sizes):
    return [rack for rack, size in enumerate(sizes) for _ in range(size)]


def test_two_racks_of_four():
    lat, bw = matrices(layout([4, 4]))
    assert infer_racks(lat, bw) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert infer_racks(lat) == [0, 0, 0, 0, 1, 1, 1, 1]  # latency alone is enough here


def test_three_racks_of_unequal_sizes():
    lat, bw = matrices(layout([3, 2, 4]), noise=0.1, seed=3)
    assert infer_racks(lat, bw) == [0, 0, 0, 1, 1, 2, 2, 2, 2]


def test_a_rack_of_one():
    lat, bw = matrices(layout([1, 3]))
    assert infer_racks(lat, bw) == [0, 1, 1, 1]


def test_racks_need_not_be_consecutive_and_are_numbered_by_lowest_rank():
    racks = [1, 0, 1, 2, 0, 2, 1]
    lat, bw = matrices(racks, noise=0.05, seed=1)
    assert infer_racks(lat, bw) == [0, 1, 0, 2, 1, 2, 0]


def test_bandwidth_alone_separates_racks_when_latency_is_flat():
    lat, bw = matrices(layout([4, 4]), inter_us=30.0, noise=0.1, seed=2)
    assert infer_racks(lat, bw) == layout([4, 4])


@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_uniform_matrices_give_one_rack(noise):
    lat, bw = matrices([0] * 8, noise=noise, seed=4)
    assert infer_racks(lat, bw) == [0] * 8
    assert infer_racks(np.full((6, 6), 40.0), np.full((6, 6), 9.0)) == [0] * 6


def test_hosts_merge_racks_and_never_split_them():
    lat, bw = matrices(layout([2, 2]))
    assert infer_racks(lat, bw, hosts=["vm"] * 4) == [0, 0, 0, 0]  # one machine: one rack
    assert infer_racks(lat, bw, hosts=["a", "b", "c", "d"]) == [0, 0, 1, 1]
    flat, _ = matrices([0] * 4)
    assert infer_racks(flat, hosts=["a", "a", "b", "b"]) == [0, 0, 0, 0]


def test_a_slow_nic_is_not_a_rack_of_its_own():
    lat, bw = matrices(layout([4, 4]), noise=0.05)
    bw[5, :] = np.minimum(bw[5, :], 0.2)
    bw[:, 5] = np.minimum(bw[:, 5], 0.2)
    np.fill_diagonal(bw, 0.0)
    assert infer_racks(lat, bw) == layout([4, 4])


def test_degenerate_sizes_and_bad_input():
    assert infer_racks(np.zeros((1, 1))) == [0]
    assert infer_racks(np.array([[0.0, 50.0], [50.0, 0.0]])) == [0, 0]
    assert infer_racks(np.zeros((3, 3))) == [0, 0, 0]  # nothing measured: no structure
    with pytest.raises(ValueError, match=r"latency_us must be a square matrix, got shape \(2, 3\)"):
        infer_racks(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="bandwidth_gbps must be a 2x2 matrix"):
        infer_racks(np.zeros((2, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="one host per rank"):
        infer_racks(np.zeros((2, 2)), hosts=["a"])
    assert renumber_racks([5, 5, 2, 7, 2]) == [0, 0, 1, 2, 1]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 5), min_size=1, max_size=5),
    latency_ratio=st.floats(3.0, 20.0),
    bandwidth_ratio=st.floats(0.05, 0.4),
    shuffle_seed=st.integers(0, 2**16),
)
def test_random_layouts_with_ten_percent_noise_are_recovered_exactly(
        sizes, latency_ratio, bandwidth_ratio, shuffle_seed):
    rng = np.random.default_rng(shuffle_seed)
    racks = rng.permutation(layout(sizes)).tolist()
    lat, bw = matrices(racks, inter_us=30.0 * latency_ratio, inter_gbps=bandwidth_ratio,
                       noise=0.1, seed=shuffle_seed)
    assert infer_racks(lat, bw) == renumber_racks(racks)


# -- contention ----------------------------------------------------------------------------

def test_no_contention_flags_nothing():
    racks = layout([4, 4])
    _, bw = matrices(racks, noise=0.1, seed=5)
    assert classify_contention(bw, racks) == {"uplinks": [], "nics": []}
    assert classify_contention(bw, racks, [1.0, 0.93]) == {"uplinks": [], "nics": []}


def test_a_slow_nic_is_flagged_exactly():
    racks = layout([4, 4])
    _, bw = matrices(racks, noise=0.1, seed=6)
    bw[5, :] *= 0.2  # every flow of rank 5, rack-mates included, in one direction
    result = classify_contention(bw, racks)
    assert [n["rank"] for n in result["nics"]] == [5]
    assert result["nics"][0]["bandwidth_gbps"] < 0.3
    assert result["uplinks"] == []  # its slow cross-rack flows do not blame rack 1's uplink


def test_pairwise_flows_decide_and_the_concurrent_aggregate_is_reported():
    racks = layout([3, 2, 4])
    _, bw = matrices(racks, noise=0.1, seed=7)
    bw[3:5, :] *= np.where(np.asarray(racks) == 1, 1.0, 0.3)  # traffic leaving rack 1 throttled
    result = classify_contention(bw, racks, [1.0, 0.35, 0.95])
    assert result == {"uplinks": [{"rack": 1, "bandwidth_gbps": 0.35}], "nics": []}
    # Aggregates alone flag nothing: a rack that sends slowly all at once but whose pairwise
    # flows run at its NICs' rate is held back by its own NICs or the CPU, not by its uplink.
    _, clean = matrices(racks, inter_gbps=1.0, noise=0.1, seed=8)
    assert classify_contention(clean, racks, [1.0, 0.35, 0.95])["uplinks"] == []
    # Pairwise flows held back everywhere (oversubscribed uplinks) cannot tell the racks
    # apart; then the aggregate does.
    _, oversubscribed = matrices(racks, noise=0.1, seed=8)
    assert [u["rack"] for u in classify_contention(oversubscribed, racks, [1.0, 0.35, 0.95])["uplinks"]] == [1]


def test_a_close_pairwise_call_is_decided_by_the_aggregate():
    racks = layout([4, 4])
    _, bw = matrices(racks, noise=0.0, seed=12)
    bw[:4, 4:] *= 0.15  # leaving rack 0: contended
    bw[4:, :4] *= 0.17  # entering rack 0: single flows held back by ACKs behind the same traffic
    assert classify_contention(bw, racks)["uplinks"] == []  # 0.88: pairwise alone cannot tell
    result = classify_contention(bw, racks, [0.29, 0.90])
    assert result["uplinks"] == [{"rack": 0, "bandwidth_gbps": 0.29}]
    # A clear aggregate leaves the close call alone.
    assert classify_contention(bw, racks, [0.85, 0.90])["uplinks"] == []
    # A slow aggregate with pairwise flows at the NICs' rate is the rack's own NICs or CPU.
    _, clean = matrices(racks, inter_gbps=1.0, noise=0.1, seed=13)
    assert classify_contention(clean, racks, [0.29, 0.90])["uplinks"] == []


def test_a_slow_uplink_is_flagged_from_pairwise_egress():
    racks = layout([4, 4])
    _, bw = matrices(racks, noise=0.1, seed=9)
    bw[4:, :4] *= 0.3  # rack 1 -> rack 0: traffic leaving rack 1 is throttled
    result = classify_contention(bw, racks)
    assert [u["rack"] for u in result["uplinks"]] == [1] and result["nics"] == []
    # Three racks, rack 2 slow both ways: racks 0 and 1 still have a clear destination.
    racks3 = layout([3, 3, 3])
    _, bw3 = matrices(racks3, noise=0.1, seed=10)
    bw3[6:, :6] *= 0.3
    bw3[:6, 6:] *= 0.3
    assert [u["rack"] for u in classify_contention(bw3, racks3)["uplinks"]] == [2]


def test_same_host_flows_are_not_judged():
    racks = [0, 0, 0, 0]
    _, bw = matrices(racks, noise=0.1, seed=11)
    bw[1, :] *= 0.1
    assert [n["rank"] for n in classify_contention(bw, racks)["nics"]] == [1]
    assert classify_contention(bw, racks, hosts=["vm"] * 4) == {"uplinks": [], "nics": []}
    # Racks forced onto one host have no uplink between them.
    assert classify_contention(bw, [0, 0, 1, 1], [1.0, 0.1], hosts=["vm"] * 4)["uplinks"] == []


def test_classify_rejects_mismatched_input():
    with pytest.raises(ValueError, match="racks names 3 ranks but bandwidth_gbps has 4"):
        classify_contention(np.ones((4, 4)), [0, 0, 1])
    with pytest.raises(ValueError, match="2 entries for 1 racks"):
        classify_contention(np.ones((4, 4)), [0, 0, 0, 0], [1.0, 2.0])
    with pytest.raises(ValueError, match="slow_ratio must lie in"):
        classify_contention(np.ones((4, 4)), [0] * 4, slow_ratio=1.5)


RECORDED = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["probes"]


@pytest.mark.parametrize("probe", RECORDED, ids=[f"{p['layout']}-{k}" for k, p in enumerate(RECORDED)])
def test_recorded_emulated_probes_are_read_exactly(probe):
    """Matrices measured by ``dssync probe`` on the emulated cluster: racks and contention
    must come out as the layout that was built (the live version is tests/emulate)."""
    racks = infer_racks(probe["latency_us"], probe["bandwidth_gbps"])
    assert [racks.count(r) for r in range(max(racks) + 1)] == probe["rack_sizes"]
    assert racks == layout(probe["rack_sizes"])
    found = classify_contention(probe["bandwidth_gbps"], racks, probe["egress_gbps"])
    assert [u["rack"] for u in found["uplinks"]] == probe["slow_uplinks"]
    assert [n["rank"] for n in found["nics"]] == probe["slow_nics"]


SINGLE_FLOW = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["single_flow_boundaries"]


@pytest.mark.parametrize("probe", SINGLE_FLOW)
def test_a_cross_rack_pair_that_ran_at_full_speed_does_not_split_a_rack(probe):
    """Recorded: uplinks as fast as a NIC, so a cross-rack pair alone on its uplink in its round
    looked like rack-mates. The other ranks' view of the two outvotes that one figure."""
    assert infer_racks(probe["latency_us"], probe["bandwidth_gbps"]) == layout(probe["rack_sizes"])


LUCKY_SPLITS = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["lucky_flow_splits"]


@pytest.mark.parametrize("probe", LUCKY_SPLITS, ids=[",".join(map(str, p["rack_sizes"])) for p in LUCKY_SPLITS])
def test_recorded_lucky_flows_neither_split_a_rack_nor_join_the_wrong_one(probe):
    """Recorded misses: no flow inside a rack was held back, most flows across every boundary
    were, and the few cross-rack pairs that ran at full speed had split a rack."""
    assert infer_racks(probe["latency_us"], probe["bandwidth_gbps"]) == layout(probe["rack_sizes"])


@pytest.mark.parametrize("lucky", [(4, 7), (2, 5), (3, 6)])
def test_one_lucky_cross_rack_pair_is_outvoted(lucky):
    lat, bw = matrices(layout([2, 3, 3]), noise=0.1, seed=3)
    lat[:] = 30.0  # latency says nothing
    np.fill_diagonal(lat, 0.0)
    i, j = lucky
    bw[i, j] = bw[j, i] = 1.0
    assert infer_racks(lat, bw) == layout([2, 3, 3])


def test_two_lucky_flows_in_a_small_world_do_not_split_a_rack():
    """Racks 2,3, rank 3's NIC busy outbound. With two pairs a round, a cross-rack pair alone
    on the uplinks runs at full speed: 0->3 and 1<->4 did, so ranks 0 and 1 disagree about
    every third party and the profile vote split both racks. No pair inside a true rack ran
    slow, so the fewest racks that keep every slow pair apart are the racks."""
    racks = [0, 0, 1, 1, 1]
    _, bw = matrices(racks, inter_gbps=0.47, intra_gbps=0.95, noise=0.04, seed=5)
    bw[0, 3] = bw[1, 4] = bw[4, 1] = 0.95
    bw[3, :] = 0.2  # another job's streams leave through rank 3's NIC
    np.fill_diagonal(bw, 0.0)
    assert fit_racks(flat_latency(5), bw).racks() == racks


def partition(racks):
    return [[i for i, r in enumerate(racks) if r == k] for k in sorted(set(racks))]


def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for k in range(len(part)):
            yield [*part[:k], [first, *part[k]], *part[k + 1:]]


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=4).filter(lambda s: 4 <= sum(s) <= 8),
       lucky=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=2),
       seed=st.integers(0, 10_000))
def test_lucky_cross_rack_flows_never_split_or_join_racks_the_slow_flows_tell_apart(sizes, lucky, seed):
    """Cross-rack flows that shared an uplink in their round (0.3-0.55 of a NIC) and a few
    that had it to themselves (full speed, both ways; every rank has one such flow at least,
    as the probe's rounds give a rack of one, so its best flow shows its NIC). Oracle, brute force over every
    partition of the ranks: where exactly one partition with the fewest racks keeps every
    slow pair apart and it is the racks built, the measurements say so, and the probe finds it.
    (Where lucky flows make another partition as small, the racks are not a fact of them.)"""
    racks = layout(sizes)
    n = len(racks)
    rng = np.random.default_rng(seed)
    same = np.equal.outer(racks, racks)
    bw = np.where(same, rng.uniform(0.9, 1.0, (n, n)), rng.uniform(0.3, 0.55, (n, n)))
    for i in range(n):  # a rack of one's flow had the uplinks to itself in some round
        if racks.count(racks[i]) == 1:
            lucky = [*lucky, (i, int(rng.choice([j for j in range(n) if j != i])))]
    for i, j in lucky:
        if i < n and j < n and racks[i] != racks[j]:
            bw[i, j] = bw[j, i] = rng.uniform(0.9, 1.0)
    np.fill_diagonal(bw, 0.0)
    slow = (bw < 0.6) | (bw.T < 0.6)
    np.fill_diagonal(slow, False)
    fits = [p for p in set_partitions(list(range(n)))
            if all(not slow[i, j] for part in p for i in part for j in part)]
    fewest = min(len(p) for p in fits)
    best = [p for p in fits if len(p) == fewest]
    assume(len(best) == 1 and sorted(map(sorted, best[0])) == sorted(map(sorted, partition(racks))))
    assert fit_racks(flat_latency(n), bw).racks() == racks


# -- ranks whose NIC is slow both ways, and how sure the racks are ------------------------------

def flat_latency(n):
    lat = np.full((n, n), 60.0)
    np.fill_diagonal(lat, 0.0)
    return lat  # latency says nothing: bandwidth alone must tell


def slow_nic(bw, rank, gbps):
    bw[rank, :] = np.minimum(bw[rank, :], gbps)
    bw[:, rank] = np.minimum(bw[:, rank], gbps)
    np.fill_diagonal(bw, 0.0)


def test_a_blind_rank_is_placed_where_its_flows_did_not_cross_an_uplink():
    racks = layout([3, 2, 3])
    _, bw = matrices(racks, inter_gbps=0.12, noise=0.05, seed=7)
    slow_nic(bw, 1, 0.35)  # its cross-rack flows (0.12) run well below its NIC (0.35)
    fit = fit_racks(flat_latency(8), bw)
    assert fit.blind == [1] and fit.racks() == racks
    assert fit.confidence()["placed"][0]["rank"] == 1 and fit.confidence()["unplaced"] == []


@pytest.mark.parametrize("confirmed", [True, False])
def test_a_placement_by_elimination_stands_only_where_the_pings_confirm_it(confirmed):
    """Rank 1's flows rule out every group but its own rack's, never a rack of its own. Where
    the blasts' pings place it there it is placed; where they tell nothing (no blast filled a
    queue) it is withdrawn to a rack of its own, unplaced and unsure, not left in the one
    group elimination left: that may put a cross-rack flow where the plan sees none."""
    racks = layout([3, 2, 3])
    _, bw = matrices(racks, inter_gbps=0.12, noise=0.05, seed=7)
    slow_nic(bw, 1, 0.35)
    fit = fit_racks(flat_latency(8), bw)
    assert fit.placed == {1: 0} and fit.tentative == {1}
    full = dict.fromkeys(range(3), confirmed)
    place_blind(fit, {1: blast_pings(0, [0, 1, 2])}, full, CLEAR_US)
    if confirmed:
        assert fit.racks() == racks and fit.confidence()["confident"]
    else:
        assert fit.unplaced == [1] and fit.racks() == [0, 1, 0, 2, 2, 3, 3, 3]
        assert not fit.confidence()["confident"] and fit.confidence()["unplaced"] == [1]


def test_a_blind_rank_the_pairs_cannot_place_is_a_rack_of_its_own_and_named():
    racks = layout([3, 3, 3])
    _, bw = matrices(racks, inter_gbps=0.5, noise=0.05, seed=8)
    slow_nic(bw, 4, 0.3)  # slower than any cross-rack share: its pairs show nothing
    fit = fit_racks(flat_latency(9), bw)
    assert fit.unplaced == [4] and sorted(fit.candidates[4]) == [0, 1, 2]
    assert fit.racks() == [0, 0, 0, 1, 2, 1, 3, 3, 3]  # never a member of the rack that looks closest
    conf = fit.confidence()
    assert conf["unplaced"] == [4] and not conf["confident"]


QUEUE_US, IDLE_US, CLEAR_US = 1500.0, 100.0, 300.0


def blast_pings(true_rack, group_racks, *, spare=True):
    """What a blind rank's pings show in each group's blast, from where it really sits: a round
    trip waits behind group g's uplink queue exactly when one end is in g's rack and the other
    is not (the ping out from a member, the ping in from an outsider)."""
    out = {}
    for g, rack in enumerate(group_racks):
        inside = true_rack == rack
        out[g] = {"out": (QUEUE_US if inside else IDLE_US, IDLE_US)}
        if spare:
            out[g]["in"] = (IDLE_US if inside else QUEUE_US, IDLE_US)
    return out


@pytest.mark.parametrize("home", [0, 1, 2])
@pytest.mark.parametrize("spare", [True, False])
def test_the_blast_whose_queue_holds_a_blind_ranks_ping_places_it(home, spare):
    racks = layout([3, 3, 3])
    _, bw = matrices(racks, inter_gbps=0.5, noise=0.05, seed=8)
    blind = {0: 1, 1: 4, 2: 7}[home]
    slow_nic(bw, blind, 0.3)
    fit = fit_racks(flat_latency(9), bw)
    assert fit.unplaced == [blind]
    place_blind(fit, {blind: blast_pings(home, [0, 1, 2], spare=spare)}, {0: True, 1: True, 2: True}, CLEAR_US)
    assert fit.racks() == racks and fit.confidence()["confident"]


def test_a_blind_rank_no_queue_holds_is_alone_only_if_every_queue_was_full():
    racks = [0, 0, 0, 1, 2, 2, 2]  # rank 3 alone in its rack, with a slow NIC
    _, bw = matrices(racks, inter_gbps=0.5, noise=0.05, seed=9)
    slow_nic(bw, 3, 0.3)
    fit = fit_racks(flat_latency(7), bw)
    assert fit.unplaced == [3] and fit.candidates[3] == [0, 1]
    pings = blast_pings(1, [0, 2], spare=False)  # groups 0 and 1 are racks 0 and 2
    place_blind(fit, {3: pings}, {0: True, 1: False}, CLEAR_US)  # group 1's blast filled no queue
    assert fit.unplaced == [3]
    place_blind(fit, {3: pings}, {0: True, 1: True}, CLEAR_US)
    assert fit.unplaced == [] and fit.racks() == racks


def test_pings_already_behind_a_queue_at_rest_or_disagreeing_place_nobody():
    racks = layout([3, 3, 3])
    _, bw = matrices(racks, inter_gbps=0.5, noise=0.05, seed=8)
    slow_nic(bw, 4, 0.3)
    fit = fit_racks(flat_latency(9), bw)
    full = {0: True, 1: True, 2: True}
    queued = {g: {k: (QUEUE_US, QUEUE_US) for k in ("out", "in")} for g in range(3)}  # another job's queue
    place_blind(fit, {4: queued}, full, CLEAR_US)
    assert fit.unplaced == [4]
    both = blast_pings(1, [0, 1, 2])
    both[0] = {"out": (QUEUE_US, IDLE_US), "in": (IDLE_US, IDLE_US)}  # group 0 claims it too: no single home
    place_blind(fit, {4: both}, full, CLEAR_US)
    assert fit.unplaced == [4]
    torn = blast_pings(1, [0, 1, 2])
    torn[1]["in"] = (QUEUE_US, IDLE_US)  # in says outsider, out says member
    torn[0]["out"] = torn[2]["out"] = (IDLE_US, IDLE_US)
    place_blind(fit, {4: torn}, full, CLEAR_US)
    assert fit.unplaced == [4]


def test_held_needs_a_clear_idle_ping_and_a_real_wait():
    assert held((1500.0, 100.0), 300.0, True) is True
    assert held((250.0, 60.0), 300.0, True) is False  # 4x its idle time, but still clear
    assert held((450.0, 100.0), 300.0, True) is False  # past clear, but a busy host's 4.5x, no queue's
    assert held((520.0, 100.0), 300.0, True) is True
    assert held((150.0, 100.0), 300.0, False) is None  # did not wait, but no queue was known full
    assert held((1500.0, 100.0), 300.0, False) is None  # waited, but maybe in another queue
    assert held((2500.0, 1500.0), 300.0, True) is None  # behind another queue at rest already
    assert held(None, 300.0, True) is None


def test_a_blind_ranks_pings_that_wait_rule_out_the_group_behind_the_queue():
    racks = [0, 0, 0, 1, 1, 1, 2, 2]  # rank 2: slow NIC, in rack 0; rack 1's uplink queue is full
    _, bw = matrices(racks, inter_gbps=0.5, noise=0.05, seed=4)
    slow_nic(bw, 2, 0.3)
    lat = np.full((8, 8), 80.0)
    rack1 = [3, 4, 5]
    for i in rack1:
        for k in range(8):
            if k not in rack1:
                lat[i, k] = lat[k, i] = 2000.0
    np.fill_diagonal(lat, 0.0)
    fit = fit_racks(lat, bw)
    assert 2 in fit.blind and 1 not in fit.candidates.get(2, [1])


def test_a_slow_nic_in_a_rack_of_two_beside_a_slow_uplink():
    """Racks 3,2,3; rack 1's uplink is slow (0.2, shared by two flows in a round) and rank 3's
    NIC is slow (0.3): every flow of both rank 3 and its rack-mate 4 is slow. Neither is a rack
    of its own nor a member of another rack: their flows to every other rack crossed an uplink,
    their flow to each other did not."""
    racks = layout([3, 2, 3])
    _, bw = matrices(racks, inter_gbps=0.45, noise=0.05, seed=10)
    for i in (3, 4):
        for j in range(8):
            if racks[j] != 1:
                bw[i, j] = bw[j, i] = 0.1
    slow_nic(bw, 3, 0.3)
    fit = fit_racks(flat_latency(8), bw)
    assert fit.racks() == racks
    assert 3 in [n["rank"] for n in classify_contention(bw, fit.racks())["nics"]]


def test_background_flows_through_a_nic_and_across_an_uplink():
    racks = layout([2, 3, 4])
    _, bw = matrices(racks, inter_gbps=0.45, noise=0.05, seed=11)
    bw[2:5, :][:, [j for j in range(9) if racks[j] != 1]] = 0.1  # rack 1's egress is shared
    bw[7, :] *= 0.3  # rank 7's NIC carries another job's flow, outbound
    np.fill_diagonal(bw, 0.0)
    fit = fit_racks(flat_latency(9), bw)
    assert fit.blind == [] and fit.racks() == racks  # rank 7 still sees its rack through its inbound flows
    found = classify_contention(bw, racks)
    assert [u["rack"] for u in found["uplinks"]] == [1] and [n["rank"] for n in found["nics"]] == [7]


@pytest.mark.parametrize("seed", range(30))
def test_a_lucky_flow_out_of_a_queued_nic_neither_splits_its_rack_nor_clears_it(seed):
    """Another job's streams leave through rank q's NIC: its pings all wait behind their
    queue and its flows out get a seventh of the NIC, but in one round that job's streams
    lulled and one flow of q's ran at 0.6 of the NIC (recorded on inter-rack+nic: 0.58
    against 0.12-0.15; q came out a rack of its own with a slow uplink, confident)."""
    rng = np.random.default_rng(seed)
    sizes = [int(k) for k in rng.integers(2, 6, size=int(rng.integers(2, 4)))]
    sizes[int(rng.integers(len(sizes)))] = int(rng.integers(3, 6))
    racks = layout(sizes)
    n = len(racks)
    _, bw = matrices(racks, intra_gbps=0.95, inter_gbps=0.3, noise=0.08, seed=seed)
    # q has two rack-mates or more: a rank whose one rack-mate is q, and whose every
    # cross-rack flow is held back, has no fast flow in (its NIC is cleared by a fan instead)
    q = int(rng.choice([i for i in range(n) if sizes[racks[i]] >= 3]))
    bw[q, :] *= rng.uniform(0.1, 0.2)
    lucky = int(rng.choice([j for j in range(n) if j != q]))
    bw[q, lucky] = 0.6
    np.fill_diagonal(bw, 0.0)
    lat = flat_latency(n)
    lat[q, :] += rng.uniform(900, 2500, n)
    lat[:, q] += rng.uniform(900, 2500, n)
    np.fill_diagonal(lat, 0.0)
    queued = queued_ranks(lat)
    assert queued == [q]
    assert fit_racks(lat, bw).racks() == racks
    found = classify_contention(bw, racks, queued=queued)
    assert [n["rank"] for n in found["nics"]] == [q] and found["uplinks"] == []
    assert list(nic_suspects(bw, queued=queued, racks=racks)) == [q]


def test_recorded_lucky_flow_out_of_a_queued_nic():
    probe = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["queued_nic_lucky_flow"]
    lat, bw = np.array(probe["latency_us"]), np.array(probe["bandwidth_gbps"])
    assert fit_racks(lat, bw).racks() == layout(probe["rack_sizes"])
    found = classify_contention(bw, layout(probe["rack_sizes"]), queued=queued_ranks(lat))
    assert [u["rack"] for u in found["uplinks"]] == [0] and [n["rank"] for n in found["nics"]] == [4]


def test_confidence_names_each_boundary_and_falls_with_the_separation():
    racks = layout([4, 4])
    _, sharp = matrices(racks, inter_gbps=0.3, noise=0.05, seed=12)
    conf = fit_racks(flat_latency(8), sharp).confidence()
    assert [b["racks"] for b in conf["boundaries"]] == [[0, 1]] and conf["boundaries"][0]["confident"]
    assert conf["boundaries"][0]["separation"] > 2.0 and conf["confident"]
    _, dull = matrices(racks, inter_gbps=0.62, noise=0.1, seed=12)
    blurred = fit_racks(flat_latency(8), dull).confidence()
    if blurred["boundaries"]:  # still split: then less sure than the sharp matrix
        assert blurred["boundaries"][0]["separation"] < conf["boundaries"][0]["separation"]


def test_a_rank_behind_a_queue_of_its_own_is_no_latency_rack_boundary():
    """Racks 2,3 told apart by distance (latency), and rank 3's NIC shared with another job's
    flows: every ping of it waits in that queue. It is left out of the clustering and named,
    not made a rack boundary that splits the others."""
    racks = [0, 0, 1, 1, 1]
    lat = np.where(np.equal.outer(racks, racks), 80.0, 400.0)
    lat[3, :] = lat[:, 3] = 1300.0
    np.fill_diagonal(lat, 0.0)
    fit = fit_racks(lat)
    assert fit.metric == "latency" and fit.unplaced == [3]
    found = fit.racks()
    assert found[0] == found[1] and found[2] == found[4] and len({found[0], found[2], found[3]}) == 3
    assert not fit.confidence()["confident"]


def test_latency_noise_does_not_split_the_one_rack_bandwidth_saw():
    """Racks 3,1 with a slow NIC on the rack of one: bandwidth sees one rack of clear workers
    and a blind one. Pings of 80 against 130 us (a busy host) are no rack boundary."""
    _, bw = matrices([0, 0, 0, 1], inter_gbps=0.95, seed=1)
    slow_nic(bw, 3, 0.2)
    lat = np.array([[0, 84, 77, 129], [84, 0, 133, 91], [76, 130, 0, 2807], [905, 773, 2480, 0]], dtype=float)
    fit = fit_racks(lat, bw)
    found = fit.racks()
    assert found[0] == found[1] == found[2] and fit.blind == [3]


def test_one_slow_round_trip_does_not_split_the_one_rack_bandwidth_saw():
    """Recorded on a 4,1 layout whose rank 1 shares its NIC with another job (its pings all
    wait): every flow of the clear ranks ran at their NICs' rate, and one round trip of
    1.9 ms (192 us the other way) made latency split ranks 0, 2, 3 and 4 three ways."""
    _, bw = matrices([0] * 5, seed=2)
    bw[1, :] = 0.2  # the other job's streams leave through rank 1's NIC
    np.fill_diagonal(bw, 0.0)
    lat = np.array([[0, 1346, 41, 192, 77], [1271, 0, 1244, 543, 1175], [40, 1172, 0, 55, 49],
                    [1936, 1287, 53, 0, 111], [55, 1128, 65, 78, 0]], dtype=float)
    found = fit_racks(lat, bw).racks()
    assert found[0] == found[2] == found[3] == found[4]


def test_clear_pings_to_the_one_clear_rack_do_not_place_a_blind_rank_in_it():
    """Recorded on 1,3,1 (rank 4's NIC at 250 Mbit/s, another job leaving rack 1, whose queue
    had drained while the pings ran): ranks 0 and 4 are blind, and rank 0's pings to ranks
    1-3 are clear. So would an outsider's be with no queue between: it stays unplaced, a rack
    of its own, and is named."""
    bw = np.array([[0, .14, .19, .15, .23], [.13, 0, .95, .95, .09], [.14, .95, 0, .95, .13],
                   [.13, .95, .95, 0, .12], [.23, .15, .15, .15, 0]])
    lat = np.array([[0, 63, 67, 65, 173], [61, 0, 100, 56, 2105], [54, 53, 0, 81, 46],
                    [61, 39, 64, 0, 65], [151, 1917, 64, 547, 0]], dtype=float)
    fit = fit_racks(lat, bw)
    assert fit.groups == [[1, 2, 3]] and 0 in fit.unplaced
    assert fit.racks() == [0, 1, 1, 1, 2] and not fit.confidence()["confident"]


def test_a_blind_rank_latency_puts_beside_a_queue_is_unsure_for_a_rack_of_its_own_waits_alike():
    """Recorded on 1,2,2 (rank 0 alone, its NIC at 400 Mbit/s; another job on rack 1's uplink):
    latency parts ranks 1-2 from 3-4 by the queue, and rank 0's pings wait to rack 1 and are
    clear to rack 2. So would they be from a rack of its own: latency puts rank 0 with rack 2
    (where the probe wrote it, confident, and wrong) but it is unsure; the clear pings of a
    two-rack world with no queue between (``flat_latency``) place nobody."""
    bw = np.array([[0, .27, .26, .38, .38], [.2, 0, .95, .18, .18], [.19, .93, 0, .18, .56],
                   [.38, .69, .42, 0, .94], [.38, .41, .48, .95, 0]])
    lat = np.array([[0, 1446, 2382, 63, 60], [1667, 0, 69, 2089, 1594], [1852, 66, 0, 1981, 2681],
                    [68, 1903, 2461, 0, 43], [46, 2564, 1741, 116, 0]], dtype=float)
    fit = fit_racks(lat, bw)
    assert fit.blind == [0] and fit.racks() == [0, 1, 1, 0, 0] and fit.queue_placed == {0}
    conf = fit.confidence()
    assert 0 in conf["unsure"] and not conf["confident"] and "rack of its own" in conf["placed"][0]["how"]
    assert fit_racks(flat_latency(5), bw).queue_placed == set()


def test_a_fan_clears_a_healthy_nic_whose_every_peer_is_behind_a_slow_link():
    """Racks 1,3,1: rank 0's NIC is slow (0.15 Gbit/s), rack 1's uplink is slow (0.15), rank 4
    is healthy. Pairwise, ranks 0 and 4 look alike: every flow of each runs at 0.13. At once,
    rank 4's flows to rank 0 and to rack 1 meet at no common link and add up; rank 0's meet
    at its NIC and carry no more than one of them."""
    racks = [0, 1, 1, 1, 2]
    bw = np.full((5, 5), 0.95)
    bw[1:4, [0, 4]] = bw[[0, 4], 1:4] = 0.13  # across rack 1's uplink
    slow_nic(bw, 0, 0.13)
    assert nic_suspects(bw) == {0: ["out", "in"], 4: ["out", "in"]}
    assert [n["rank"] for n in classify_contention(bw, racks)["nics"]] == [0, 4]
    # what the links allow: rank 4 out, one flow at 0.13 to rank 0 and 0.15 shared by rack 1
    healthy = {0: 0.13, 1: 0.05, 2: 0.05, 3: 0.05}
    slow = {1: 0.04, 2: 0.04, 3: 0.04, 4: 0.03}  # rank 0 out: its NIC's 0.15 over four flows
    assert fan_clears(bw, racks, 4, "out", healthy) and fan_clears(bw, racks, 4, "in", healthy)
    assert not fan_clears(bw, racks, 0, "out", slow)
    fans = {4: {"out": healthy, "in": healthy}, 0: {"out": slow}}
    assert [n["rank"] for n in classify_contention(bw, racks, fans=fans)["nics"]] == [0]
    # a fan that cleared one slow direction but not the other leaves the NIC slow
    fans[4]["in"] = {0: 0.03, 1: 0.03, 2: 0.03, 3: 0.03}
    assert [n["rank"] for n in classify_contention(bw, racks, fans=fans)["nics"]] == [0, 4]


def test_a_fan_into_one_bottleneck_clears_nothing():
    """Every peer behind one uplink: the fan's sum says nothing about the rank's own NIC."""
    racks = [0, 1, 1, 1]
    bw = np.full((4, 4), 0.95)
    bw[0, 1:] = bw[1:, 0] = 0.2
    np.fill_diagonal(bw, 0.0)
    assert not fan_clears(bw, racks, 0, "out", {1: 0.2, 2: 0.2, 3: 0.2})


def test_a_rack_of_one_beside_background_flows_is_not_a_slow_nic():
    """Recorded on the emulated 1,3,1 layout with rank 4's NIC at 250 Mbit/s and another job's
    streams leaving rack 1: rank 0 (healthy, alone) took 0.17-0.23 Gbit/s from every peer and
    was flagged, which also kept rack 1's egress to it out of the uplink's judgement. Its fans
    (0.92 out, 0.50 in, rates as measured) carried what the paths allow; rank 4's did not."""
    racks = [0, 1, 1, 1, 2]
    bw = np.array([[0, 0.45, 0.50, 0.45, 0.23], [0.19, 0, 0.95, 0.95, 0.14], [0.17, 0.95, 0, 0.95, 0.18],
                   [0.18, 0.95, 0.95, 0, 0.18], [0.23, 0.19, 0.18, 0.18, 0]])
    aggregates = [0.0, 0.33, 0.0]
    before = classify_contention(bw, racks, aggregates)
    assert [n["rank"] for n in before["nics"]] == [0, 4] and before["uplinks"] == []
    fans = {0: {"in": {1: 0.1, 2: 0.09, 3: 0.09, 4: 0.22}, "out": {1: 0.23, 2: 0.23, 3: 0.23, 4: 0.23}},
            4: {"in": {0: 0.1, 1: 0.04, 2: 0.04, 3: 0.04}}}
    after = classify_contention(bw, racks, aggregates, fans=fans)
    assert [n["rank"] for n in after["nics"]] == [4] and [u["rack"] for u in after["uplinks"]] == [1]


def test_a_fan_cleared_nic_counts_what_its_fan_carried():
    """Recorded (`bench probe-layouts --seed 0`, 3,2 with rack 1's uplink at 300 Mbit/s and
    rank 4's NIC at 400): rank 3's only flow not across the slow uplink is to rank 4, so its
    best single flow (0.38) is rank 4's NIC, not its own; its fans (0.63 out, 0.63 in at once)
    cleared it. Judged at 0.38, rack 1's blast (0.31) looked like 81 % of its NICs and no uplink
    was flagged: a network that is not the one built. The oracle is the same-network rule."""
    from dssync.bench.probe_layouts import Layout
    from dssync.bench.same_network import Answer, same_network

    racks = [0, 0, 0, 1, 1]
    bw = np.array([[0, 0.95, 0.95, 0.26, 0.28], [0.93, 0, 0.94, 0.28, 0.25], [0.92, 0.91, 0, 0.15, 0.16],
                   [0.23, 0.29, 0.13, 0, 0.38], [0.28, 0.22, 0.16, 0.38, 0]])
    aggregates = [0.3245, 0.3069]
    fans = {3: {"out": {0: 0.09, 1: 0.09, 2: 0.09, 4: 0.3554}, "in": {0: 0.1, 1: 0.1, 2: 0.1, 4: 0.3342}},
            4: {"in": {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.3863}}}
    found = classify_contention(bw, racks, aggregates, fans=fans)
    answer = Answer(tuple(racks), {u["rack"]: None for u in found["uplinks"]}, {n["rank"]: None for n in found["nics"]})
    layout = Layout.from_spec({"rack_sizes": [3, 2], "slow_uplinks": {"1": "300mbit"}, "slow_nics": {"4": "400mbit"}})
    assert same_network(layout, answer), found
    # between two racks, one uplink slow both ways: flagging both racks is the same network,
    # and too close to the rule (0.49 of one NIC) to be sure
    assert set(unsure_flags(bw, racks, aggregates, fans=fans)["uplinks"]) >= {u["rack"] for u in found["uplinks"]}


def test_an_uplink_is_held_against_what_its_racks_nics_send():
    """Recorded (`bench probe-layouts --seed 1`, 2,2 with rack 0's uplink at 400 Mbit/s and
    another job's two streams out of rank 0's NIC): rank 1 took in 0.29 Gbit/s at best (its
    peers send through the slow uplink or the busy NIC) and its fan-in 0.52 at once, but it
    sent 0.91 to its rack-mate. Held against 0.52, rack 0's 0.41 Gbit/s blast looked like
    most of what its NICs carry and no uplink was flagged, in three runs of that layout; held
    against what rank 1's NIC sends, both racks carried under 0.6 of a NIC alike, and between
    two racks flagging both is the same network as the one slow uplink built. The oracle is
    the same-network rule."""
    from dssync.bench.probe_layouts import Layout
    from dssync.bench.same_network import Answer, same_network

    racks = [0, 0, 1, 1]
    bw = np.array([[0, 0.168, 0.13, 0.062], [0.911, 0, 0.354, 0.292], [0.14, 0.294, 0, 0.958],
                   [0.182, 0.255, 0.954, 0]])
    aggregates = [0.4128, 0.3956]
    fans = {1: {"in": {0: 0.17, 2: 0.18, 3: 0.17}}}
    found = classify_contention(bw, racks, aggregates, fans=fans)
    assert [n["rank"] for n in found["nics"]] == [0], found
    answer = Answer(tuple(racks), {u["rack"]: None for u in found["uplinks"]}, {n["rank"]: None for n in found["nics"]})
    layout = Layout.from_spec({"rack_sizes": [2, 2], "slow_uplinks": {"0": "400mbit"}, "nic_flows": [0]})
    assert same_network(layout, answer), found
    # and the same answer without the uplink flags is not
    assert not same_network(layout, Answer(tuple(racks), {}, {0: None}))


def test_a_nic_flag_with_no_clear_rack_mate_and_no_fan_is_unsure():
    """Recorded (`bench probe-layouts --seed 0`, v16: 5,2 with rack 1 behind a 200 Mbit/s
    uplink that another job's flows load, ranks 0 and 6 behind 250 Mbit/s NICs): rank 5's
    best flows, 0.24 Gbit/s, were all with rank 6, the rest crossed the busy uplink, and its
    fan was not run (its pings waited in the uplink's queue). Its clear NIC was flagged and
    the uplink was not, and the answer was marked confident: a network that is not the one
    built (the oracle is the same-network rule), which the probe cannot tell from its pairs."""
    from dssync.bench.probe_layouts import Layout
    from dssync.bench.same_network import Answer, same_network

    racks = [0, 0, 0, 0, 0, 1, 1]
    bw = np.array([[0, 0.24, 0.239, 0.239, 0.239, 0.085, 0.157], [0.238, 0, 0.956, 0.957, 0.925, 0.159, 0.159],
                   [0.238, 0.956, 0, 0.918, 0.948, 0.091, 0.09], [0.238, 0.956, 0.947, 0, 0.956, 0.094, 0.156],
                   [0.239, 0.956, 0.956, 0.958, 0, 0.091, 0.096], [0.044, 0.061, 0.033, 0.07, 0.044, 0, 0.24],
                   [0.056, 0.051, 0.058, 0.06, 0.054, 0.239, 0]])
    aggregates = [0.1984, 0.1226]
    fans = {0: {"in": {1: 0.05, 2: 0.05, 3: 0.05, 4: 0.05, 5: 0.03, 6: 0.02}}}
    found = classify_contention(bw, racks, aggregates, fans=fans)
    assert [n["rank"] for n in found["nics"]] == [0, 5, 6] and found["uplinks"] == [], found
    layout = Layout.from_spec({"rack_sizes": [5, 2], "slow_uplinks": {"1": "200mbit"},
                               "slow_nics": {"0": "250mbit", "6": "250mbit"}, "uplink_flows": [1]})
    answer = Answer(tuple(racks), {}, {n["rank"]: n["bandwidth_gbps"] for n in found["nics"]})
    assert not same_network(layout, answer)
    assert {5, 6} <= set(unsure_flags(bw, racks, aggregates, fans=fans)["nics"])
    # rank 0's flag stands on its clear rack-mates' flows (0.24 with each, 0.96 among them)
    assert 0 not in unsure_flags(bw, racks, aggregates, fans=fans)["nics"]


def test_a_nic_flag_whose_fan_nearly_cleared_it_is_unsure():
    """Recorded (`bench probe-layouts --seed 0`, 1,4,2 with rack 1's uplink at 150 Mbit/s and
    another job leaving rack 2): rank 0 alone, its NIC clear, every path of it behind a slow
    link. Its fan in cleared it; its fan out carried 0.49 of the 0.67 its paths allow (0.73,
    against the 0.75 rule) and flagged it, confidently. The layout's truth is the oracle: the
    NIC is clear, so the flag must be unsure. A fan that carried half (a NIC that bounds two
    bottlenecks' flows) stays a sure flag."""
    from dssync.bench.probe_layouts import Layout

    racks = [0, 1, 1, 1, 1, 2, 2]
    bw = np.array([[0, 0.15, 0.13, 0.13, 0.12, 0.52, 0.52], [0.14, 0, 0.96, 0.96, 0.96, 0.12, 0.07],
                   [0.11, 0.96, 0, 0.96, 0.96, 0.07, 0.13], [0.14, 0.96, 0.96, 0, 0.96, 0.06, 0.08],
                   [0.09, 0.96, 0.96, 0.96, 0, 0.13, 0.13], [0.2, 0.12, 0.06, 0.08, 0.1, 0, 0.96],
                   [0.19, 0.08, 0.1, 0.07, 0.13, 0.96, 0]])
    aggregates = [float("nan"), 0.1476, 0.1519]
    fans = {0: {"out": {1: 0.05, 2: 0.05, 3: 0.05, 4: 0.05, 5: 0.1463, 6: 0.1463},
                "in": {1: 0.04, 2: 0.04, 3: 0.04, 4: 0.04, 5: 0.0665, 6: 0.0664}}}
    layout = Layout.from_spec({"rack_sizes": [1, 4, 2], "slow_uplinks": {"1": "150mbit"}, "uplink_flows": [2]})
    assert 0 not in layout.contended_nics
    flagged = [n["rank"] for n in classify_contention(bw, racks, aggregates, fans=fans)["nics"]]
    assert flagged == [0]
    assert 0 in unsure_flags(bw, racks, aggregates, fans=fans)["nics"]
    held = {0: {"out": {1: 0.05, 2: 0.05, 3: 0.05, 4: 0.05, 5: 0.065, 6: 0.065}, "in": fans[0]["in"]}}  # 0.49
    assert [n["rank"] for n in classify_contention(bw, racks, aggregates, fans=held)["nics"]] == [0]
    assert 0 not in unsure_flags(bw, racks, aggregates, fans=held)["nics"]


def test_a_rack_of_one_shows_its_uplink_by_its_fan():
    """The 1,3,1 layout above: every single flow runs at 0.13, so rack 1's slow uplink and rack
    2's clear one look alike pairwise. Rank 4's fan out, alone in rack 2, carried 0.27 across
    its uplink: rack 1's 0.13 is slow beside it. Rack 1's blast had no flows (its outside ranks
    were pinging): the figure reported is the pairwise one, not a zero."""
    racks = [0, 1, 1, 1, 2]
    bw = np.full((5, 5), 0.95)
    bw[1:4, [0, 4]] = bw[[0, 4], 1:4] = 0.13
    slow_nic(bw, 0, 0.13)
    nan = float("nan")
    assert classify_contention(bw, racks, [nan, nan, nan])["uplinks"] == []
    fans = {4: {"out": {0: 0.13, 1: 0.05, 2: 0.05, 3: 0.04}, "in": {0: 0.13, 1: 0.05, 2: 0.05, 3: 0.05}},
            0: {"out": {1: 0.04, 2: 0.04, 3: 0.04, 4: 0.03}}}
    found = classify_contention(bw, racks, [nan, nan, nan], fans=fans)
    assert found == {"uplinks": [{"rack": 1, "bandwidth_gbps": 0.13}], "nics": [{"rank": 0, "bandwidth_gbps": 0.13}]}


def test_a_blast_filled_its_queue_when_the_spare_member_waited():
    clear = 250.0
    assert filled((1800.0, 90.0), clear, uplink_slow=False)  # clear at rest, waited during
    assert not filled((150.0, 90.0), clear, uplink_slow=True)  # never waited
    # behind a queue at rest already (2400 us): the rack's own uplink's when the pairs found it
    # slow (another job's flows leave the rack, layout 5,4 rack:0), else the far side's
    assert filled((3400.0, 2400.0), clear, uplink_slow=True)
    assert not filled((3400.0, 2400.0), clear, uplink_slow=False)


def standing_queue_latency(outside=()):
    """Racks 4,1,3 (ranks 4 and 5 blind), another job's flows leaving rack 2: every round trip
    between rack 2 and the rest waits in that queue at rest (about 2 ms), every other one is
    clear (about 80 us). Ranks in ``outside`` sit on racks of their own instead."""
    racks = np.array([0, 0, 0, 0, 1, 2, 2, 2])
    racks[list(outside)] = 10 + np.arange(len(outside))
    behind = racks == 2
    lat = np.where(np.not_equal.outer(behind, behind), 2000.0, 80.0) * np.random.default_rng(4).uniform(0.7, 1.3, (8, 8))
    np.fill_diagonal(lat, 0.0)
    return lat


def queued_fit():
    """What the pairs leave: the clear ranks' racks, ranks 4 and 5 blind and unplaced."""

    return RackFit(n=8, groups=[[0, 1, 2, 3], [6, 7]], blind=[4, 5], candidates={4: [0, 1], 5: [0, 1]})


@pytest.mark.parametrize("flagged", [True, False])
def test_a_blind_rank_behind_its_racks_standing_queue_is_placed_there(flagged):
    """Rank 5's pings reach ranks 6 and 7 clear and wait to everyone else, as theirs do: it
    reaches them without crossing their uplink's queue. Rank 4's pings are clear to rack 0,
    whose uplink holds no queue: it may be a member or alone, and stays unplaced. Only a
    group whose uplink the flows found slow has a standing queue of its own."""
    fit = place_behind_standing_queue(queued_fit(), standing_queue_latency(), 240.0, [1] if flagged else [])
    if flagged:
        assert fit.unplaced == [4] and fit.racks() == [0, 0, 0, 0, 1, 2, 2, 2] and fit.placed == {5: 1}
    else:
        assert fit.unplaced == [4, 5]


def test_a_blind_rank_outside_the_queued_rack_is_not_placed_in_it():
    """Rank 5 on a rack of its own: its pings to 6 and 7 cross their uplink's queue and wait."""
    fit = place_behind_standing_queue(queued_fit(), standing_queue_latency(outside=[5]), 240.0, [1])
    assert fit.unplaced == [4, 5]


def test_recorded_blind_rank_behind_a_standing_queue():
    """Layout 0 of `dssync bench probe-layouts --seed 0` (4,1,3, NICs 4 and 5 at 200 Mbit/s,
    another job leaving rack 2), recorded: rank 5's ping out of its rack in rack 2's blast
    waited at rest already and the rack of two had no member to spare, so the blasts could
    not place it. Its pings reach ranks 6 and 7 clear and wait to everyone else, and ranks
    6 and 7 send out at below half of what they take in: the pairs place it behind rack 2's
    queue already, and the standing queue that the flows flag keeps it there. Rank 4, whose
    pings are clear to rack 0 with no queue of its own, stays unplaced."""
    probe = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["standing_queue"]
    lat, bw = probe["latency_us"], probe["bandwidth_gbps"]
    fit = fit_racks(lat, bw)
    assert fit.unplaced == [4] and "queue" in fit.evidence[5]
    slow = {u["rack"] for u in classify_contention(bw, fit.racks())["uplinks"]}
    place_behind_standing_queue(fit, lat, clear_latency(np.asarray(lat)),
                                [g for g, members in enumerate(fit.groups) if fit.racks()[members[0]] in slow])
    assert fit.racks() == [0, 0, 0, 0, 1, 2, 2, 2] and fit.unplaced == [4]


@pytest.mark.parametrize("seed", range(30))
def test_a_clear_nic_whose_pings_wait_beside_a_queued_rack_mate_is_not_flagged(seed):
    """Recorded in CI (3,2,4; another job's streams through rank 1's NIC): rank 2, rank 1's
    rack-mate, had its pings wait as well (a busy host), and the median of its flows with its
    two mates, 0.95 and 0.15 Gbit/s, put its clear NIC below the line. Only rack-mates whose
    own NIC is clear speak for it; with two contended NICs in one rack, both still show."""
    rng = np.random.default_rng(seed)
    # p's NIC contended too, or clear (then in a rack of three, as recorded); with both, a
    # third mate still has a clear one beside it (a rank whose every fast flow is gone is
    # cleared by a fan, not by pairs)
    both = bool(rng.integers(2))
    sizes = [int(k) for k in rng.integers(2, 6, size=int(rng.integers(2, 4)))]
    rack = int(rng.integers(len(sizes)))
    sizes[rack] = int(rng.integers(4, 6)) if both else 3
    racks = layout(sizes)
    n = len(racks)
    _, bw = matrices(racks, intra_gbps=0.95, inter_gbps=0.3, noise=0.08, seed=seed)
    members = [i for i in range(n) if racks[i] == rack]
    q, p = (int(x) for x in rng.choice(members, size=2, replace=False))
    contended = sorted({q, p}) if both else [q]
    for i in contended:
        bw[i, :] *= rng.uniform(0.1, 0.2)
    np.fill_diagonal(bw, 0.0)
    lat = flat_latency(n)
    for i in (q, p):  # q's and p's pings wait: q behind its NIC's queue, p on a busy host
        lat[i, :] += rng.uniform(900, 2500, n)
        lat[:, i] += rng.uniform(900, 2500, n)
    np.fill_diagonal(lat, 0.0)
    queued = queued_ranks(lat)
    assert queued == sorted({q, p})
    found = classify_contention(bw, racks, queued=queued)
    assert [x["rank"] for x in found["nics"]] == contended and found["uplinks"] == []


BUSY = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["busy_host_splits"]


@pytest.mark.parametrize("probe", BUSY, ids=[p["layout"] for p in BUSY])
def test_a_rack_split_on_a_busy_host_is_unsure_and_a_second_pass_mends_it(probe):
    """Recorded on two cores shared with other work: one pass of the pairs split a rack.
    The fit says it is unsure, so ``dssync probe`` measures every pair again; each path's
    best of that pass and another (here the layout's recorded passes, made on a quiet
    machine) gives the layout as built, with confidence."""
    from dssync.probing.probe import best_paths
    from dssync.topology.racks import fit_racks

    hosts = [f"w{i}" for i in range(sum(probe["rack_sizes"]))]
    busy = (np.asarray(probe["latency_us"]), np.asarray(probe["bandwidth_gbps"]))
    fit = fit_racks(*busy, hosts)
    assert fit.racks() == probe["found_racks"] != layout(probe["rack_sizes"])
    assert not fit.confidence()["confident"]
    others = [p for p in RECORDED if p["layout"] == probe["layout"]]
    assert others
    for other in others:
        mended = fit_racks(*best_paths(busy, (np.asarray(other["latency_us"]), np.asarray(other["bandwidth_gbps"]))),
                           hosts)
        assert mended.racks() == layout(probe["rack_sizes"]) and mended.confidence()["confident"]


def test_best_paths_keeps_each_paths_lowest_measured_latency_and_highest_bandwidth():
    first = (np.array([[0.0, 5.0], [0.0, 0.0]]), np.array([[0.0, 1.0], [0.5, 0.0]]))
    again = (np.array([[0.0, 7.0], [3.0, 0.0]]), np.array([[0.0, 0.8], [0.9, 0.0]]))
    from dssync.probing.probe import best_paths

    lat, bw = best_paths(first, again)
    assert lat.tolist() == [[0.0, 5.0], [3.0, 0.0]] and bw.tolist() == [[0.0, 1.0], [0.9, 0.0]]


ONE_RACK = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["one_rack_fallback"]


@pytest.mark.parametrize("probe", ONE_RACK, ids=[p["layout"] for p in ONE_RACK])
def test_a_rack_mate_pair_just_past_the_gap_splits_no_rack_and_merges_none(probe):
    """Recorded: linkage found the racks, one rack-mate flow ran at 1.53 of the nearest cost and
    another at 2.17, and splitting their ends off left five racks no metric separated, so the
    fit wrote one rack of nine, confident. The racks as built come out; the boundary next to
    the slow pair is unsure, so the probe measures again, and the layout's quiet passes mend it."""
    from dssync.probing.probe import best_paths
    from dssync.topology.racks import fit_racks

    busy = (np.asarray(probe["latency_us"]), np.asarray(probe["bandwidth_gbps"]))
    fit = fit_racks(*busy)
    assert fit.racks() == layout(probe["rack_sizes"])
    others = [p for p in RECORDED if p["layout"] == probe["layout"]]
    assert others
    for other in others:
        mended = fit_racks(*best_paths(busy, (np.asarray(other["latency_us"]), np.asarray(other["bandwidth_gbps"]))))
        assert mended.racks() == layout(probe["rack_sizes"]) and mended.confidence()["confident"]


def test_one_rack_written_because_no_metric_separates_is_unsure():
    """Two slow pairs, 0-1 and 2-3, that no rack layout explains (each of the four is near
    the other pair and rank 4): linkage splits the ranks, no split is clean, and the fit
    falls back to one rack. That rack is a guess, and the fit says so for every rank."""
    from dssync.topology.racks import fit_racks

    lat = np.full((5, 5), 100.0)
    lat[0, 1] = lat[1, 0] = lat[2, 3] = lat[3, 2] = 300.0
    np.fill_diagonal(lat, 0.0)
    fit = fit_racks(lat)
    assert fit.racks() == [0] * 5
    confidence = fit.confidence()
    assert not confidence["confident"] and confidence["unsure"] == [0, 1, 2, 3, 4] and confidence["one_rack_guess"]
    from dssync.commands.probe import confidence_lines

    assert any("no split of them into racks was clean" in line for line in confidence_lines(confidence))
    uniform = np.full((5, 5), 100.0)
    np.fill_diagonal(uniform, 0.0)
    assert fit_racks(uniform).confidence()["confident"]  # one rack, and nothing says otherwise


CONFIDENT_SPLITS = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["confident_splits"]


@pytest.mark.parametrize("probe", CONFIDENT_SPLITS, ids=[p["layout"] for p in CONFIDENT_SPLITS])
def test_a_busy_pass_that_splits_a_rack_is_settled_by_more_passes(probe):
    """Recorded on two cores with the emulated tests run one after another: one pass of the
    pairs gave a wrong answer. ``settle_racks`` measures again until one more pass leaves
    every rank's rack-mates as they were; with the layout's quiet recordings as the later
    passes, the racks as built come out, settled and confident, after three passes (the
    wrong first fit, the mended second, the third that confirms it)."""
    from dssync.probing.probe import settle_racks
    from dssync.topology.racks import fit_racks

    hosts = [f"w{i}" for i in range(sum(probe["rack_sizes"]))]
    busy = (np.asarray(probe["latency_us"]), np.asarray(probe["bandwidth_gbps"]))
    assert fit_racks(*busy, hosts).racks() == probe["found_racks"] != layout(probe["rack_sizes"])
    quiet = [(np.asarray(p["latency_us"]), np.asarray(p["bandwidth_gbps"])) for p in RECORDED
             if p["rack_sizes"] == probe["rack_sizes"] and p["layout"].split(" ")[0] == probe["layout"].split(" ")[0]]
    assert len(quiet) >= 2
    for later in (quiet[:2], quiet[-2:]):
        feed = iter(later)
        lat, bw, fit, passes = settle_racks(busy, feed.__next__, lambda a, b: fit_racks(a, b, hosts))
        assert fit.racks() == layout(probe["rack_sizes"]) and passes == 3
        assert fit.confidence()["confident"] and fit.confidence()["unsettled"] == []
        assert (bw >= busy[1]).all() and (bw >= later[0][1]).all()


def test_a_one_rack_answer_is_a_guess_while_bandwidth_clusters_the_ranks_apart():
    """The 3,2,4 recording written as one rack: the racks' cross flows ran 5-13 times slower
    than the nearest rack-mate's, yet no metric's clusters were clean (rack-mates' flows up
    to 2.8x). One rack is then a guess: unsure of every rank, so the probe measures again."""
    from dssync.topology.racks import fit_racks

    probe = next(p for p in CONFIDENT_SPLITS if p["found_racks"] == [0] * 9)
    fit = fit_racks(np.asarray(probe["latency_us"]), np.asarray(probe["bandwidth_gbps"]))
    confidence = fit.confidence()
    assert fit.racks() == [0] * 9 and confidence["one_rack_guess"] and not confidence["confident"]
    assert confidence["unsure"] == list(range(9))


def two_racks(sizes, cross_gbps, slow_rank=None):
    """Latency flat, bandwidth 0.9 inside a rack and ``cross_gbps`` across, and, where
    ``slow_rank`` is given, that rank's flows inside its rack as slow as cross ones."""
    n = sum(sizes)
    rack = layout(sizes)
    bw = np.where(np.equal.outer(rack, rack), 0.9, cross_gbps)
    if slow_rank is not None:
        mates = [j for j in range(n) if rack[j] == rack[slow_rank] and j != slow_rank]
        bw[slow_rank, mates] = bw[mates, slow_rank] = cross_gbps
    np.fill_diagonal(bw, 0.0)
    lat = np.full((n, n), 100.0)
    np.fill_diagonal(lat, 0.0)
    return lat, bw


def _mates(racks):
    return [{j for j, r in enumerate(racks) if r == racks[i]} for i in range(len(racks))]


@pytest.mark.parametrize("seed", range(6))
def test_a_rank_that_only_one_pass_places_is_unsettled_and_unsure(seed):
    """One pass shows a rank at its rack-mates' rates and every later pass shows it cut
    off from them (a host busy for the rest of the probe). The best of the passes puts it
    back in its rack, but only because of that one pass: leaving it out moves the rank, so
    after the last pass the rank and the rack-mates it changes are unsettled, named in the
    confidence and unsure, and the probe stops at ``max_passes``."""
    from dssync.probing.probe import settle_racks
    from dssync.topology.racks import fit_racks

    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(3, 6)), int(rng.integers(3, 6))]
    n = sum(sizes)
    slow = int(rng.integers(n))
    passes = [two_racks(sizes, 0.3), two_racks(sizes, 0.3, slow), two_racks(sizes, 0.3, slow)]
    feed = iter(passes[1:])
    lat, bw, fit, count = settle_racks(passes[0], lambda: next(feed), fit_racks, max_passes=3)
    assert count == 3 and fit.racks() == layout(sizes)
    cut_off = fit_racks(*passes[1]).racks()
    moved = [i for i, (a, b) in enumerate(zip(_mates(layout(sizes)), _mates(cut_off), strict=True)) if a != b]
    assert slow in moved and fit.confidence()["unsettled"] == moved
    assert set(moved) <= set(fit.confidence()["unsure"]) and not fit.confidence()["confident"]
    assert bw.tolist() == np.maximum.reduce([p[1] for p in passes]).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_a_different_busy_rank_in_each_pass_settles_on_the_racks(seed):
    """Each pass cuts a different rank off from its rack-mates (hosts busy in turn, one in
    each of three racks): no single pass decides the answer once three are in, so the racks
    as built come out settled and confident after three passes (two disagree: each alone
    moves its rank). Two busy ranks of one rack in two of three passes would leave their
    own pair never measured clear without the third, and the jackknife rightly calls that
    unsettled."""
    from dssync.probing.probe import settle_racks
    from dssync.topology.racks import fit_racks

    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(3, 6)) for _ in range(3)]
    starts = np.cumsum([0, *sizes[:-1]])
    slow = [int(start + rng.integers(size)) for start, size in zip(starts, sizes, strict=True)]
    slow = [slow[i] for i in rng.permutation(3)]
    passes = [two_racks(sizes, 0.3, s) for s in slow]
    feed = iter(passes[1:])
    lat, bw, fit, count = settle_racks(passes[0], lambda: next(feed), fit_racks, max_passes=3)
    assert count == 3 and fit.racks() == layout(sizes)
    assert fit.confidence()["confident"] and fit.confidence()["unsettled"] == []


def test_a_quiet_world_settles_after_two_passes():
    from dssync.probing.probe import settle_racks
    from dssync.topology.racks import fit_racks

    world = two_racks([3, 4], 0.3)
    lat, bw, fit, passes = settle_racks(world, lambda: world, fit_racks)
    assert passes == 2 and fit.racks() == layout([3, 4]) and fit.confidence()["confident"]


def test_flags_too_close_to_call_are_unsure():
    """``unsure_flags``: a flag whose ratio sits near the 0.6 rule, or an uplink that carried
    less than its NICs allow while no rack stood out, is named; clear calls are not."""
    racks = layout([4, 4])
    _, bw = matrices(racks, noise=0.05, seed=21)  # cross-rack pairs held back (0.25 of the NICs)
    assert unsure_flags(bw, racks, [0.91, 0.92]) == {"uplinks": [], "nics": []}  # static: aggregates agree
    assert unsure_flags(bw, racks, [0.20, 0.90]) == {"uplinks": [], "nics": []}  # rack 0 busy: far below
    # rack 0's aggregate at 0.62 of rack 1's: flagged or not is a coin toss on a noisy host
    assert unsure_flags(bw, racks, [0.50, 0.90])["uplinks"] == [0]
    # both slow alike (one uplink at 150 Mbit/s both ways between two racks): no rack stands
    # out, yet each carried a sixth of a NIC: both flagged (no flow tells whose uplink it is)
    assert [u["rack"] for u in classify_contention(bw, racks, [0.15, 0.16])["uplinks"]] == [0, 1]
    assert unsure_flags(bw, racks, [0.15, 0.16])["uplinks"] == []
    # a busy uplink beside a clear rack whose blast a busy host held back: not alike enough
    # to be sure of either
    assert unsure_flags(bw, racks, [0.14, 0.21])["uplinks"] == [0, 1]
    # a NIC at 0.55 of the others' estimate is a close call; at 0.3 or 0.9 it is not
    racks3 = layout([3, 3, 3])
    for factor, unsure in ((0.55, [1]), (0.3, []), (0.9, [])):
        _, bw3 = matrices(racks3, inter_gbps=1.0, noise=0.02, seed=22)
        bw3[1, :] *= factor
        assert unsure_flags(bw3, racks3)["nics"] == unsure, factor


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=4).filter(lambda s: 4 <= sum(s) <= 9),
       seed=st.integers(0, 10_000), level=st.floats(0.3, 1.0),
       ratios=st.lists(st.floats(0.2, 1.0), min_size=4, max_size=4))
def test_a_flag_that_noise_of_a_quarter_could_flip_is_unsure(sizes, seed, level, ratios):
    """An oracle of robustness, not of the rule: where a rack's aggregate measured 20 % lower
    or 25 % higher would flip its flag, the probe cannot be sure of it and must say so.
    Cross-rack pairs held back (a quarter of the NICs), so the aggregates decide."""
    racks = layout(sizes)
    _, bw = matrices(racks, noise=0.1, seed=seed)
    agg = [level * x for x in ratios[:len(sizes)]]
    unsure = set(unsure_flags(bw, racks, agg)["uplinks"])
    flagged = {u["rack"] for u in classify_contention(bw, racks, agg)["uplinks"]}
    for r in range(len(sizes)):
        for factor in (0.8, 1.25):
            moved = [a * factor if k == r else a for k, a in enumerate(agg)]
            if (r in {u["rack"] for u in classify_contention(bw, racks, moved)["uplinks"]}) != (r in flagged):
                assert r in unsure, (r, factor, agg, sorted(flagged))


def test_unsure_flags_take_a_blast_that_carried_nothing():
    """An aggregate of 0 (a blast whose flows all failed) is a measurement, not a crash."""
    racks = layout([4, 4])
    _, bw = matrices(racks, noise=0.05, seed=23)
    found = unsure_flags(bw, racks, [0.0, 0.0])
    assert set(found["uplinks"]) <= {0, 1} and found["nics"] == []


# -- a queue between rack-mates is an uplink's --------------------------------------------------

def test_a_rank_whose_pings_to_its_rack_mates_wait_is_taken_out_of_their_rack():
    """Recorded on 1,4,2 (another job on rack 2's uplink, rack 1 behind 150 Mbit/s): the
    rack of one's flows into rack 2 got 0.5-0.7 Gbit/s and the probe wrote it into rack 2,
    confident. Its pings to ranks 5 and 6 waited 2.2-2.7 ms, theirs to each other 55-89 us,
    and its pings to rack 1 were clear: a queue between rack-mates would be at a NIC, and
    then every ping of that rank would wait. It is a rack of its own, unsure."""
    lat = np.array([[0, 89, 52, 92, 107, 2656, 2240], [87, 0, 77, 105, 101, 1320, 2983],
                    [469, 82, 0, 60, 86, 2864, 1297], [175, 203, 61, 0, 111, 1606, 2656],
                    [118, 156, 119, 108, 0, 2558, 2480], [2586, 2587, 2635, 2588, 2578, 0, 55],
                    [2645, 2586, 2433, 2553, 2544, 89, 0]], dtype=float)
    fit = RackFit(n=7, groups=[[0, 5, 6], [1, 2, 3, 4]])
    assert split_across_queues(fit, lat) == {0}
    assert renumber_racks(fit.racks()) == [0, 1, 1, 1, 1, 2, 2]
    conf = fit.confidence()
    assert conf["unsure"] == [0] and conf["queue_split"] == [0] and not conf["confident"]
    # with the racks that were built, nothing moves
    built = RackFit(n=7, groups=[[0], [1, 2, 3, 4], [5, 6]])
    assert split_across_queues(built, lat) == set() and built.confidence()["confident"]


def queue_latency(racks, busy, seed, noisy=0.0):
    """One-way µs between ranks of ``racks`` whose rack ``busy``'s uplink holds another
    job's queue: 40-110 us where no queue is crossed, 1.2-3 ms across it, and each ping with
    probability ``noisy`` held 0.5-2 ms by a busy host."""
    rng = np.random.default_rng(seed)
    n = len(racks)
    lat = rng.uniform(40, 110, (n, n))
    across = np.array([[(racks[i] == busy) != (racks[j] == busy) for j in range(n)] for i in range(n)])
    lat = np.where(across, rng.uniform(1200, 3000, (n, n)), lat)
    lat = np.where(rng.random((n, n)) < noisy, lat + rng.uniform(500, 2000, (n, n)), lat)
    np.fill_diagonal(lat, 0.0)
    return lat


@pytest.mark.parametrize("seed", range(40))
def test_the_racks_that_were_built_are_never_split_and_a_rank_merged_across_a_queue_is(seed):
    """Seeded random layouts of 3-5 racks (1-5 workers each), another job's queue on one
    rack's uplink. The racks that were built lose nobody, also where busy hosts held some
    pings. A rank written into a rack across that queue from its own comes out of it, on a
    rack of its own, where the rack it was written into has two other ranks or more and the
    rank has two peers or more on its side of the queue outside that rack; otherwise
    nothing moves."""
    rng = np.random.default_rng(1000 + seed)
    sizes = [int(s) for s in rng.integers(1, 6, int(rng.integers(3, 6)))]
    racks = [r for r, size in enumerate(sizes) for _ in range(size)]
    n = len(racks)
    busy = int(rng.choice([r for r, size in enumerate(sizes) if size >= 2] or [0]))
    groups = [[i for i, r in enumerate(racks) if r == rack] for rack in range(len(sizes))]
    built = RackFit(n=n, groups=[list(g) for g in groups])
    assert split_across_queues(built, queue_latency(racks, busy, seed, noisy=0.03)) == set()
    # one rank written into a rack across the busy uplink from its own
    lat = queue_latency(racks, busy, seed)
    stray = int(rng.integers(n))
    target = int(rng.choice([r for r in range(len(sizes)) if (r == busy) != (racks[stray] == busy)]))
    wrong = [[i for i in g if i != stray] for g in groups]
    wrong[target].append(stray)
    fit = RackFit(n=n, groups=[g for g in wrong if g])
    peers = [k for k in range(n) if k != stray and (racks[k] == busy) == (racks[stray] == busy)
             and racks[k] != target]
    moved = split_across_queues(fit, lat)
    if sizes[target] >= 2 and len(peers) >= 2:
        assert moved == {stray} and stray in fit.confidence()["unsure"]
        alone = [r if i != stray else len(sizes) for i, r in enumerate(racks)]
        assert renumber_racks(fit.racks()) == renumber_racks(alone)
    else:
        assert moved == set()


def test_recorded_rack_of_blind_ranks_behind_its_uplink_s_queue_is_one_rack():
    """3,2 with another job's streams leaving rack 1 and rank 4 behind a 200 Mbit/s NIC,
    recorded (v23 seed 1): both ranks of rack 1 are blind (rank 3 sends out at 0.2 and
    takes in at 0.5, rank 4 at its NIC both ways), their pings to ranks 0-2 wait 2 ms and
    to each other are clear. Every sweep from v2 to v23 wrote them on racks of their own."""
    probe = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["queue_rack"]
    fit = fit_racks(probe["latency_us"], probe["bandwidth_gbps"])
    assert fit.racks() == [0, 0, 0, 1, 1] and fit.unplaced == []
    assert all("queue" in fit.evidence[j] for j in (3, 4))


def queue_matrices(racks, nic, busy, seed, *, out_cap, in_cap, queue_us):
    """Pairs' latency and bandwidth where another job's streams leave rack ``busy``: its
    flows out get at most ``out_cap``, its flows in ``in_cap`` (their acks leave through
    that queue), and a round trip between it and any other rack waits ``queue_us``."""
    rng = np.random.default_rng(seed)
    n, racks = len(racks), np.asarray(racks)
    bw, lat = np.zeros((n, n)), np.zeros((n, n))
    for s in range(n):
        for d in range(n):
            if s == d:
                continue
            cap = min(nic[s], nic[d])
            if racks[s] == busy and racks[d] != busy:
                cap = min(cap, out_cap)
            if racks[d] == busy and racks[s] != busy:
                cap = min(cap, in_cap)
            bw[s, d] = cap * rng.uniform(0.93, 1.0)
            lat[s, d] = rng.uniform(40.0, 150.0) + (queue_us if (racks[s] == busy) != (racks[d] == busy) else 0.0)
    return lat, bw


@settings(max_examples=60, deadline=None)
@given(clear=st.integers(2, 5), blind=st.integers(2, 3), here=st.booleans(),
       nics=st.lists(st.sampled_from([1.0, 0.4, 0.3, 0.15]), min_size=3, max_size=3),
       out_cap=st.floats(0.1, 0.25), in_cap=st.floats(0.3, 0.5), queue_us=st.floats(1500.0, 3000.0),
       seed=st.integers(0, 2**16))
def test_blind_ranks_are_one_rack_behind_a_queue_only_where_the_queue_is_theirs(clear, blind, here, nics, out_cap,
                                                                                in_cap, queue_us, seed):
    """Drawn: one clear rack and ``blind`` more ranks, each of whose flows to it are slow.
    ``here``: the blind ranks are one rack whose uplink another job's streams leave through;
    otherwise each is a rack of one behind a slow NIC, and the streams leave the clear rack.
    Ranks are put together behind a queue only where they are one rack; and where some
    blind rank's flows out run below half its flows in, the queue is theirs and they are."""
    if here:
        racks = [0] * clear + [1] * blind
        nic = [1.0] * clear + nics[:blind]
        busy = 1
    else:
        racks = [0] * clear + [1 + k for k in range(blind)]
        nic = [1.0] * clear + [min(x, 0.4) for x in nics[:blind]]  # blind: slow both ways
        busy = 0
    lat, bw = queue_matrices(racks, nic, busy, seed, out_cap=out_cap, in_cap=in_cap, queue_us=queue_us)
    fit = fit_racks(lat, bw)
    found = fit.racks()
    put = [j for j, why in fit.evidence.items() if "one rack behind" in why]
    for j in put:  # never a rank with one that is not its rack-mate
        assert all((found[j] == found[k]) == (racks[j] == racks[k]) for k in range(len(racks))), (found, racks)
    outs = [np.median(bw[j, :clear]) / np.median(bw[:clear, j]) for j in range(clear, clear + blind)]
    if here and min(outs) < 0.45 and sorted(fit.blind) == list(range(clear, clear + blind)):
        assert found == renumber_racks(racks), (found, racks, fit.evidence)
