"""The replay check of the racks (``dssync.topology.replay``) on hand cases and on flows whose
rates come from the bench's own link model of the emulated network
(``dssync.bench.same_network``, which knows nothing of the prober), slowed at random as a
busy host slows them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_rates import measured

from dssync.bench.probe_layouts import Layout
from dssync.bench.same_network import Answer, same_network, true_network
from dssync.probing.phases import round_robin_rounds
from dssync.topology.placement import RackFit
from dssync.topology.replay import (
    DOUBT,
    MIN_GAIN,
    concurrent_flows,
    cut_partitions,
    max_min_rates,
    misfit,
    replay_fit,
    replay_racks,
)


def test_max_min_rates_shares_a_full_link_and_hands_what_a_slower_flow_leaves_to_the_others():
    # A (1.0) carries flows 0, 1 and 2; flow 2 also crosses B (0.3): it gets 0.3, and the
    # other two split what is left of A, 0.35 each. Flow 3 is alone on C (0.8).
    rates = max_min_rates([["A"], ["A"], ["A", "B"], ["C"]], {"A": 1.0, "B": 0.3, "C": 0.8})
    np.testing.assert_allclose(rates, [0.35, 0.35, 0.3, 0.8])


def test_concurrent_flows_are_a_rounds_pairs_one_direction_at_a_time():
    bw = np.zeros((4, 4))
    bw[0, 1], bw[1, 0], bw[2, 3], bw[3, 2] = 0.9, 0.8, 0.5, 0.4
    out = concurrent_flows([([[(0, 1), (2, 3)]], bw)])
    assert [flows for flows, _ in out] == [[(0, 1), (2, 3)], [(1, 0), (3, 2)]]
    np.testing.assert_allclose(out[0][1], [0.9, 0.5])
    np.testing.assert_allclose(out[1][1], [0.8, 0.4])


def rack_sizes(most_racks: int) -> st.SearchStrategy[list[int]]:
    """2 to ``most_racks`` racks of 1-4 workers, 4-9 workers in all."""
    return st.lists(st.integers(1, 4), min_size=2, max_size=most_racks).filter(lambda s: 4 <= sum(s) <= 9)


def test_a_rack_of_three_behind_an_uplink_as_fast_as_its_nics_is_found_where_the_best_rates_show_none():
    # 1,1,3 with every uplink at 1 Gbit/s: each pair alone gets a NIC's rate, so the best
    # rates show one rack. The rounds in which the two single workers send into the rack of
    # three at once halve both flows, and only racks that put those flows on one link explain that.
    layout = Layout((1, 1, 3))
    observed = concurrent_flows(measured(layout, seed=0))
    one_rack = [0] * 5
    assert misfit(layout.racks, observed) + MIN_GAIN < misfit(one_rack, observed)
    replay = replay_racks(one_rack, observed)
    assert replay.moves
    assert same_network(layout, Answer(tuple(replay.racks)))


@settings(max_examples=25, deadline=None)
@given(sizes=rack_sizes(3),
       seed=st.integers(0, 2**16))
def test_the_true_racks_stay_where_they_are(sizes, seed):
    """Started from the racks that were built, no move explains the flows better by MIN_GAIN."""
    layout = Layout(tuple(sizes))
    replay = replay_racks(layout.racks, concurrent_flows(measured(layout, seed)))
    assert not replay.moves, replay.moves


@settings(max_examples=25, deadline=None)
@given(sizes=rack_sizes(3),
       seed=st.integers(0, 2**16), data=st.data())
def test_a_worker_put_in_the_wrong_rack_is_moved_back_or_named_unsure(sizes, seed, data):
    """From the built racks with one worker moved to another rack (what a fit misled by a
    busy host writes), the replay's answer is the same network as the one built, or a
    worker it gets wrong is among the ranks it doubts, or the flows cannot tell: the racks
    built explain them no better than the answer does by ``DOUBT`` (with four workers, no
    round of disjoint pairs puts two flows on one uplink at all). The clustering's own
    separations then decide how sure the probe is."""
    layout = Layout(tuple(sizes))
    racks = list(layout.racks)
    worker = data.draw(st.integers(0, len(racks) - 1))
    racks[worker] = data.draw(st.sampled_from([r for r in range(len(sizes)) if r != racks[worker]]))
    fit = RackFit(n=len(racks), groups=[[i for i, r in enumerate(racks) if r == g] for g in sorted(set(racks))])
    observed = concurrent_flows(measured(layout, seed))
    replay_fit(fit, observed)
    answer = fit.racks()
    if not same_network(layout, Answer(tuple(answer))):
        truth = layout.racks
        wrong = {i for i in range(len(answer))
                 if {j for j in range(len(answer)) if answer[j] == answer[i]}
                 != {j for j in range(len(answer)) if truth[j] == truth[i]}}
        flows_tell = misfit(truth, observed) + DOUBT <= misfit(answer, observed)
        assert wrong & fit.unexplained or not flows_tell, (answer, truth, fit.unexplained)


def test_a_blind_rank_keeps_the_fitted_groups():
    """Where a rank is blind (its placement names the fitted groups), the replay moves no
    one; it only names the ranks it doubts."""
    layout = Layout((1, 1, 3))
    fit = RackFit(n=6, groups=[[0, 1, 2, 3, 4]], blind=[5])
    bw_passes = []
    for rounds, bw in measured(layout, seed=1):
        grown = np.zeros((6, 6))
        grown[:5, :5] = bw
        bw_passes.append((rounds, grown))
    replay = replay_fit(fit, concurrent_flows(bw_passes))
    assert replay is not None and not replay.moves
    assert fit.groups == [[0, 1, 2, 3, 4]]
    assert fit.unexplained, "one rack does not explain the halved flows"


def test_one_clear_rank_has_nothing_to_replay():
    assert replay_fit(RackFit(n=1, groups=[[0]]), []) is None


def test_a_search_out_of_time_stops_where_it_is_and_says_so():
    layout = Layout((1, 1, 3))
    observed = concurrent_flows(measured(layout, seed=0))
    replay = replay_racks([0] * 5, observed, seconds=0.0)
    assert replay.cut_short and not replay.moves and not replay.doubt_one_rack
    assert replay.racks == [0] * 5
    assert sorted(replay.margins) == list(range(5)), "the kept answer's margins are computed in full"


class _Ticks:
    """A CPU clock that advances one second each time it is read: the search's budget in
    answers tried instead of seconds, the same on every machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_one_rack_is_doubted_where_the_search_from_every_worker_alone_ran_out_ahead_of_it(monkeypatch):
    """Cut short, the search from every worker alone is half an agglomeration and is not
    taken; where it already explains the flows better than the fitted one rack by MIN_GAIN,
    every worker is unsure."""
    import dssync.topology.replay as replay_module

    layout = Layout((1, 1, 3))
    observed = concurrent_flows(measured(layout, seed=0))
    clock = _Ticks()
    monkeypatch.setattr(replay_module.time, "process_time", clock)
    whole = replay_racks([0] * 5, observed, seconds=1e9)
    assert not whole.cut_short and same_network(layout, Answer(tuple(whole.racks)))
    reads = clock.now
    # the same search with three reads fewer: cut in its last look around the racks it found
    clock.now = 0.0
    monkeypatch.setattr(replay_module, "SEARCH_SECONDS", reads - 3)
    fit = RackFit(n=5, groups=[[0, 1, 2, 3, 4]])
    replay = replay_fit(fit, observed)
    assert replay is not None and replay.cut_short and replay.doubt_one_rack
    assert fit.groups == [[0, 1, 2, 3, 4]] and fit.unexplained == {0, 1, 2, 3, 4}


def test_cut_partitions_hold_every_number_of_racks_and_the_blocks_of_a_clear_matrix():
    # two racks of 0.9 Gbit/s inside, 0.2 across: the cut at two racks is the blocks
    bw = np.full((5, 5), 0.2)
    bw[:3, :3] = bw[3:, 3:] = 0.9
    np.fill_diagonal(bw, 0.0)
    cuts = cut_partitions([bw, bw * 0.95])
    assert (0, 0, 0, 1, 1) in cuts
    assert (0, 0, 0, 0, 0) in cuts and (0, 1, 2, 3, 4) in cuts
    assert cut_partitions([np.zeros((1, 1))]) == []


@pytest.mark.parametrize(("sizes", "single_moves_reach"), [((3, 2, 2), False), ((2, 2, 2, 2), True),
                                                           ((4, 5, 3, 4), False)])
@pytest.mark.parametrize("seed", range(2))
def test_from_one_rack_a_clusterings_cut_reaches_racks_no_chain_of_single_moves_does(sizes, single_moves_reach, seed):
    """Uplinks as fast as NICs: no lone flow shows the racks, and (but for 2,2,2,2, whose
    oriented passes halve enough flows for single moves from every worker alone to find it)
    no single move or merge from one rack or from every worker alone explains MIN_GAIN
    more; the cut of a pass matrix whose rounds shared the uplinks is the whole answer at once."""
    layout = Layout(sizes)
    passes = measured(layout, seed)
    observed = concurrent_flows(passes)
    one_rack = [0] * sum(sizes)
    assert same_network(layout, Answer(tuple(replay_racks(one_rack, observed).racks))) == single_moves_reach
    replay = replay_racks(one_rack, observed, starts=cut_partitions([bw for _, bw in passes]))
    assert replay.moves[0] == {"start": "a clustering's cut"}
    assert same_network(layout, Answer(tuple(replay.racks)))


@settings(max_examples=25, deadline=None)
@given(sizes=rack_sizes(4),
       seed=st.integers(0, 2**16))
def test_from_the_true_racks_no_cut_explains_the_flows_better(sizes, seed):
    layout = Layout(tuple(sizes))
    passes = measured(layout, seed)
    replay = replay_racks(layout.racks, concurrent_flows(passes), starts=cut_partitions([bw for _, bw in passes]))
    assert same_network(layout, Answer(tuple(replay.racks))), replay.moves


def test_flows_tell_says_whether_the_pairs_flows_would_have_told_the_racks_apart():
    from dssync.bench.probe_layouts import flows_tell

    def topology(layout, found, passes):
        return {"workers": [{"rack": r} for r in found],
                "confidence": {"pair_rates": [{"rounds": rounds, "gbps": bw.tolist()} for rounds, bw in passes]}}

    # 1,1,3 written as one rack: the halved rounds tell (the search should have moved them)
    layout = Layout((1, 1, 3))
    passes = measured(layout, seed=0)
    assert flows_tell(layout, topology(layout, [0] * 5, passes)) == "missed"
    assert flows_tell(layout, {"workers": [{"rack": 0}] * 5, "confidence": {}}) is None
    # 3,1 with the lone worker put with the three: one flow per NIC, no round shares an uplink
    layout = Layout((3, 1))
    passes = measured(layout, seed=0)
    assert flows_tell(layout, topology(layout, [0, 0, 0, 0], passes)) == "no"


def _noiseless(layout: Layout, passes: list) -> list:
    net = true_network(layout)
    return [(flows, np.array(net.rates(flows))) for rounds in passes for pairs in rounds
            for flows in ([(a, b) for a, b in pairs], [(b, a) for a, b in pairs])]


@pytest.mark.parametrize(("layout", "found"), [
    (Layout((1, 3, 2), slow_nics={4: "400mbit"}), [0, 0, 0, 0, 1, 0]),
    (Layout((3, 4, 1), nic_flows=(6,)), [0, 0, 0, 1, 1, 1, 2, 1]),
    (Layout((1, 1, 5, 1), slow_uplinks={0: "200mbit"}, slow_nics={4: "200mbit"}), [0, 1, 1, 1, 2, 1, 1, 1]),
])
def test_oriented_passes_put_together_the_flows_that_tell_a_wrong_answer(layout, found):
    """Wrong answers the probe once gave (`bench probe-layouts`, seeds 0, 1 and 2), each merging
    a worker into a rack next to its own. On the link model without noise, three passes
    whose flows all run from each pair's lower rank first never put a flow into the wrong
    rack beside one out of it, and explain the wrong racks as well as the built ones; the
    later passes oriented by their seed do, and tell them apart by more than MIN_GAIN."""
    n = len(layout.racks)
    oriented = [round_robin_rounds(n, relabel=k) for k in range(3)]
    plain = [[sorted(tuple(sorted(p)) for p in pairs) for pairs in rounds] for rounds in oriented]
    assert plain != oriented
    told_plain = misfit(found, _noiseless(layout, plain)) - misfit(layout.racks, _noiseless(layout, plain))
    told = misfit(found, _noiseless(layout, oriented)) - misfit(layout.racks, _noiseless(layout, oriented))
    assert told_plain < DOUBT <= MIN_GAIN <= told


def _blind_case(layout: Layout, seed: int):
    passes = measured(layout, seed)
    bw = np.max([b for _, b in passes], axis=0)
    n = len(layout.racks)
    lat = np.full((n, n), 50.0)
    np.fill_diagonal(lat, 0.0)
    return passes, bw, lat


@pytest.mark.parametrize("seed", range(3))
def test_with_a_blind_worker_the_replay_moves_the_clear_ones_and_the_blind_are_worked_out_again(seed):
    """A layout the probe once got wrong (`bench probe-layouts --seed 0`, 3,2,2 with rank 0's
    NIC at 150 Mbit/s and another job leaving rack 1): rank 0 is blind, and the fit merged
    racks that only shared flows tell apart. The replay moves the clear workers to the racks
    that were built; rank 0's candidates are worked out again on them and hold its own rack
    (the blasts' pings place it from there). Without that, the fitted racks stay and the
    workers the replay would move are doubted."""
    from dssync.topology.placement import reassess_blind
    from dssync.topology.racks import fit_racks

    layout = Layout((3, 2, 2), slow_nics={0: "150mbit"}, uplink_flows=(1,))
    passes, bw, lat = _blind_case(layout, seed)
    kept = fit_racks(lat, bw)
    fitted = kept.racks()
    replay_fit(kept, concurrent_flows(passes), starts=cut_partitions([b for _, b in passes]))
    assert kept.racks() == fitted and kept.unexplained
    fit = fit_racks(lat, bw)
    assert fit.blind == [0]
    built = {frozenset(i for i in range(1, 7) if layout.racks[i] == r) for r in range(3)} - {frozenset()}
    assert {frozenset(g) for g in fit.groups} != built
    replay_fit(fit, concurrent_flows(passes), starts=cut_partitions([b for _, b in passes]),
               reassess=lambda f: reassess_blind(f, bw, lat, None))
    assert {frozenset(g) for g in fit.groups} == built and 0 not in fit.placed
    assert any(set(fit.groups[g]) == {1, 2} for g in fit.candidates[0])
    # rank 0's flows moved nobody, and its true rack-mates are among the workers that moved:
    # they are only as sure as rank 0's place
    moved = {i for i in range(1, 7) if {j for j in range(7) if fitted[j] == fitted[i]} !=
             {j for j in range(7) if fit.racks()[j] == fit.racks()[i]}}
    assert moved and moved <= fit.unexplained and not fit.confidence()["confident"]


@settings(max_examples=15, deadline=None)
@given(sizes=rack_sizes(4), seed=st.integers(0, 2**16), data=st.data())
def test_after_the_replay_every_blind_worker_is_judged_on_the_racks_it_left(sizes, seed, data):
    """Whatever the replay does with the clear workers, the blind ones are judged on the
    groups it hands back: none sits in a group, every candidate names one of the new groups,
    and a flow between true rack-mates never rules their group out (it crosses no uplink)."""
    from dssync.topology.placement import reassess_blind
    from dssync.topology.racks import fit_racks

    n = sum(sizes)
    slow = data.draw(st.integers(0, n - 1))
    layout = Layout(tuple(sizes), slow_nics={slow: "150mbit"})
    passes, bw, lat = _blind_case(layout, seed)
    fit = fit_racks(lat, bw)
    replay_fit(fit, concurrent_flows(passes), starts=cut_partitions([b for _, b in passes]),
               reassess=lambda f: reassess_blind(f, bw, lat, None))
    in_groups = {i for g in fit.groups for i in g}
    for j in fit.blind:
        assert j not in in_groups or fit.placed.get(j) is not None
        assert all(0 <= g < len(fit.groups) for g in fit.candidates.get(j, []))
        mates_groups = [g for g, members in enumerate(fit.groups)
                        if members and all(layout.racks[i] == layout.racks[j] for i in members)]
        for g in mates_groups:
            if j not in fit.placed and fit.candidates.get(j) is not None:
                assert g in fit.candidates[j]


def test_ranks_on_one_host_move_together_and_are_never_split():
    """Ranks on one host are one machine, so in one rack: the search moves them as one and
    never keeps an answer that parts them, whatever the flows say. 1,1,3 built with ranks 0
    and 1 on one host (so the network is really 2,3): from one rack, the replay may split the
    ranks into racks but never 0 from 1."""
    layout = Layout((1, 1, 3))
    observed = concurrent_flows(measured(layout, seed=0))
    hosts = ["a", "a", "c", "d", "e"]
    replay = replay_racks([0] * 5, observed, hosts=hosts)
    assert replay.racks[0] == replay.racks[1]
    from dssync.topology.replay import neighbours
    for labels, what in neighbours((0, 0, 0, 1, 1), range(5), hosts):
        assert labels[0] == labels[1], what
    # every rank on one host: nothing can move
    assert replay_racks([0] * 5, observed, hosts=["h"] * 5).racks == [0] * 5
