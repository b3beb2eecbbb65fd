"""The telling rounds (``dssync.topology.telling``): flows designed to tell the probe's racks
from their nearest rivals, judged on rates from the bench's own link model of the emulated
network (``dssync.bench.same_network``, which knows nothing of the prober), each slowed at
random as a busy host slows it."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from model_rates import measured

from dssync.bench.probe_layouts import Layout
from dssync.bench.same_network import best_answer, same_network, true_network
from dssync.probing.probe import best_paths
from dssync.topology import telling
from dssync.topology.contention import classify_contention
from dssync.topology.matrices import queued_ranks
from dssync.topology.replay import concurrent_flows
from dssync.topology.replay import moved_ranks as moved
from dssync.topology.telling import (
    MAX_RUNS,
    TELL_ROUNDS,
    WHY,
    alternatives,
    design,
    judge,
    predict,
    standing_answers,
    unsteady,
    untold_ties,
)


def tell(layout: Layout, racks: list[int], seed: int, slowdown: float = 0.3,
         movable: list[int] | None = None, steps: int = 3,
         max_rounds: int = TELL_ROUNDS, floors: bool = True, passes: list | None = None,
         scale: float = 1.0, carry: bool = True, rounds_on: Layout | None = None) -> tuple[list[int], set[int], list]:
    """The probe's design-run-judge steps (``dssync.probing.probe._tell``), each round's
    flows rated by the bench's model and slowed by up to ``slowdown``, the rounds whose best
    two runs disagree run again, no flow out of an uplink the pairs flag: the racks they end
    at, the ranks they doubt, and each step's verdict. ``floors=False`` predicts each NIC at
    the most it was seen to carry; ``passes`` (``(rounds, bandwidth_gbps)`` each) replace the
    model's pairs phase, and the model's rates are scaled by ``scale``. ``carry=False``: a
    step does not tell the last verdict's ``tied`` rivals first. ``rounds_on``: the network
    the telling rounds run on, where it changed since the pairs (another job took more of a NIC)."""
    net = true_network(rounds_on or layout)
    n = len(racks)
    movable = list(range(n)) if movable is None else movable
    passes = measured(layout, seed) if passes is None else passes
    observed = concurrent_flows(passes)
    _, best = best_paths(*[(np.zeros_like(bw), bw) for _, bw in passes])
    rng = np.random.default_rng(seed + 1)
    rejected, verdicts, doubted, judged, history, tied = [], [], set(), [], [], []
    for _ in range(steps):
        flags = classify_contention(best, racks)
        avoid = [[i for i, r in enumerate(racks) if r == u["rack"]] for u in flags["uplinks"]]
        plan = design(racks, observed, movable, skip=judged, max_rounds=max_rounds, avoid=avoid,
                      slow_nics=[u["rank"] for u in flags["nics"]] if floors else None, first=tied)
        if not plan.rounds:
            break

        def run(flows: list) -> np.ndarray:
            return scale * np.asarray(net.rates(flows)) * rng.uniform(1 - slowdown, 1.0, len(flows))

        runs = [[run(flows) for flows in plan.rounds] for _repeat in range(2)]
        while len(runs) < MAX_RUNS and (again := unsteady(runs)):
            runs.append([run(flows) if k in again else None for k, flows in enumerate(plan.rounds)])
        verdict = judge(plan, observed, runs, rejected, history)
        history += verdict.ran
        verdicts.append(verdict)
        doubted |= verdict.doubted
        tied = verdict.tied if carry else []
        if verdict.racks is None:
            if not plan.unrun:
                break
            judged += [plan.rivals[k][0] for k in sorted({k for ks in plan.told for k in ks})]
            continue  # rivals that found no room in this step's rounds: the next step tells them
        rejected.append(plan.answer)
        judged = []
        racks = list(verdict.racks)
    return racks, doubted, verdicts


def right(layout: Layout, racks: list[int]) -> bool:
    return same_network(layout, best_answer(layout, racks))


def mispredicted(layout: Layout, seed: int) -> bool:
    """Whether the capacities the rounds read off the pairs (``measured(layout, seed)``)
    predict some flow of the first step's rounds, from the racks that were built, more than
    10 % away from the bench's model of the network built."""
    passes = measured(layout, seed)
    observed = concurrent_flows(passes)
    _, best = best_paths(*[(np.zeros_like(bw), bw) for _, bw in passes])
    racks = list(layout.racks)
    flags = classify_contention(best, racks)
    plan = design(racks, observed, list(range(len(racks))), slow_nics=[u["rank"] for u in flags["nics"]],
                  avoid=[[i for i, r in enumerate(racks) if r == u["rack"]] for u in flags["uplinks"]])
    net = true_network(layout)
    for k, flows in enumerate(plan.rounds):
        true = np.asarray(net.rates(flows))
        for ceiling in {plan.ceilings[r] for r in plan.told[k]}:
            if np.any(np.abs(np.log(predict(plan.answer, plan.answer_caps[ceiling], flows) / true)) > np.log(1.1)):
                return True
    return False


def test_a_rack_of_one_merged_into_its_neighbour_is_told_apart():
    # 4,2,1 with uplinks as fast as NICs: no single pair tells worker 6 from a member of the
    # rack of two, and the probe once wrote them as one rack, confidently. A flow from 6 into
    # the rack of two beside one from the rack of four into it gets half a NIC on the network
    # built and a whole one on that answer.
    layout = Layout((4, 2, 1))
    merged = [0, 0, 0, 0, 1, 1, 1]
    assert not right(layout, merged)
    plan = design(merged, concurrent_flows(measured(layout, 0)), list(range(7)))
    assert plan.rounds
    racks, _, verdicts = tell(layout, merged, seed=0)
    assert verdicts[0].racks is not None
    assert right(layout, racks), racks


def test_rivals_that_find_no_room_in_the_rounds_are_told_by_the_next_step():
    # 4,2,1 merged again, with room for one round a step: seven workers hold one pattern of
    # four a round, and the pairs' flows explain every worker alone as well as the answer, so
    # the rival that is the network built may be among those a step has no room for (on the
    # emulated racks four rounds told four of seven and left the right one out). The next
    # step tells the rivals left over instead of keeping the answer unchallenged.
    layout = Layout((4, 2, 1))
    merged = [0, 0, 0, 0, 1, 1, 1]
    observed = concurrent_flows(measured(layout, 0))
    first = design(merged, observed, list(range(7)), max_rounds=1)
    assert len(first.rounds) == 1 and first.unrun
    later = design(merged, observed, list(range(7)), max_rounds=1,
                   skip=[labels for labels, _ in first.rivals if labels not in first.unrun])
    assert {labels for labels, _ in later.rivals} == set(first.unrun)
    racks, _, _ = tell(layout, merged, seed=0, max_rounds=1, steps=len(first.rivals) + 1)
    assert right(layout, racks), racks


def test_two_racks_of_one_merged_are_told_apart_without_coming_back():
    # 1,1,3,1: workers 0 and 1 written as one rack. The first rival the rounds prefer may be
    # another wrong answer that explains the same rounds (0 with 5); the next step moves on
    # from it and never back to the answer already ruled out.
    layout = Layout((1, 1, 3, 1))
    racks, _, verdicts = tell(layout, [0, 0, 1, 1, 1, 2], seed=0)
    assert right(layout, racks), racks
    taken = [v.racks for v in verdicts if v.racks is not None]
    assert len(taken) == len(set(taken))


def test_rates_at_the_answer_s_predictions_keep_it_and_at_a_rival_s_take_it():
    layout = Layout((4, 2, 1))
    observed = concurrent_flows(measured(layout, 3))
    truth = layout.racks
    plan = design(truth, observed, list(range(7)))
    assert plan.rounds and plan.rivals
    from dssync.topology.telling import _caps  # the capacities the judge predicts with
    caps = _caps(plan.answer, observed, max(plan.ceilings))
    at_answer = [[predict(plan.answer, caps, flows) for flows in plan.rounds]] * 2
    verdict = judge(plan, observed, at_answer)
    assert verdict.racks is None
    # a rival's own predictions, for the rounds that tell it, take that rival (or another
    # that explains the same rates at least as well)
    k = next(k for k, told in enumerate(plan.told) if told)
    r = plan.told[k][0]
    labels, ceiling = plan.rivals[r][0], plan.ceilings[r]
    at_rival = [[predict(labels, _caps(labels, observed, ceiling), flows) for flows in plan.rounds]] * 2
    verdict = judge(plan, observed, at_rival)
    assert verdict.racks is not None


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=4).filter(lambda s: 4 <= sum(s) <= 9),
       slow_uplink=st.integers(-1, 3), slow_nic=st.integers(-1, 8), seed=st.integers(0, 2**16))
def test_the_rounds_never_move_the_racks_that_were_built(sizes, slow_uplink, slow_nic, seed):
    """From the true racks, with every telling flow slowed by up to 15 % in each run, no step
    takes a rival that is not the same network: the rounds can doubt a rank, never lose a
    right answer. Blind ranks (a slow NIC) move too, as in the probe. Networks whose rates
    the capacities read off the pairs mispredict for the racks that were built, on the rounds
    the first step runs (by more than 10 %), are the known failures at the end of this file,
    and left to them (10 of 600 drawn networks).

    15 %, twice the worst measured: on the emulated racks (records v14, every layout without
    another job's flows, 296 telling flows, busy CPUs included) a flow's best run came within
    7 % of the bench model's rate, never further below it. Rounds that tell 1.15x differences
    (``TELL_RATIO``) cannot also survive every run of a flow slowed by 30 %: at 30 % this
    failed on about one drawn network in two thousand (4,3 with a 400 Mbit/s uplink and NIC,
    a rack-mate's flow read 15 % slow in both runs)."""
    n = sum(sizes)
    layout = Layout(tuple(sizes),
                    slow_uplinks={slow_uplink: "400mbit"} if 0 <= slow_uplink < len(sizes) else {},
                    slow_nics={slow_nic: "400mbit"} if 0 <= slow_nic < n else {})
    assume(not mispredicted(layout, seed))
    racks, _, _ = tell(layout, list(layout.racks), seed, slowdown=0.15)
    assert right(layout, racks), (layout, racks)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=4).filter(lambda s: 4 <= sum(s) <= 9),
       slow_uplink=st.integers(-1, 3), slow_nic=st.integers(0, 8), share=st.floats(0.6, 0.9),
       seed=st.integers(0, 2**16))
def test_a_nic_another_job_takes_more_of_in_the_rounds_moves_no_rack_for_sure(sizes, slow_uplink, slow_nic, share, seed):
    """A NIC shared with another job: the pairs read it at 200 Mbit/s, and while the telling
    rounds run the other job takes more of it (the rank's flows get ``share`` of what they got
    in the pairs). From the true racks, the steps end at the same network, or every rank
    they moved away from it is unsure: a flow behind a slow NIC running slower than predicted
    is no firm sign against the racks (``telling.slowed_at_nic``). The networks the capacities read off the pairs mispredict are
    left to the known failures, as in ``test_the_rounds_never_move_the_racks_that_were_built``."""
    n = sum(sizes)
    assume(slow_nic < n)
    uplinks = {slow_uplink: "400mbit"} if 0 <= slow_uplink < len(sizes) else {}
    layout = Layout(tuple(sizes), slow_uplinks=uplinks, slow_nics={slow_nic: "200mbit"})
    assume(not mispredicted(layout, seed))
    busier = Layout(tuple(sizes), slow_uplinks=uplinks, slow_nics={slow_nic: f"{round(200 * share)}mbit"})
    racks, _, verdicts = tell(layout, list(layout.racks), seed, slowdown=0.05, rounds_on=busier)
    unsure = set().union(*(v.shaky for v in verdicts))
    assert right(layout, racks) or moved(layout.racks, racks) <= unsure, (layout, share, racks, unsure)


def replayed_step(case: dict) -> tuple[Layout, telling.Design, telling.Verdict]:
    """A recorded telling step (``emulated_probes.json``: its layout, the pairs' rates, the
    step's rounds and their rates) designed again as the probe designs it, checked to give the
    rounds the probe ran, and judged on their recorded rates: the layout, the design, the verdict."""
    passes = [([[tuple(f) for f in flows] for flows in rnd["rounds"]], np.array(rnd["gbps"])) for rnd in case["pair_rates"]]
    observed = concurrent_flows(passes)
    step = case["step"]
    queued = queued_ranks(np.array(case["latency_us"]))
    flags = classify_contention(np.array(case["bandwidth_gbps"]), step["racks"], queued=queued)
    plan = design(step["racks"], observed, sorted(set(range(len(step["racks"]))) - set(queued)),
                  avoid=[[i for i, r in enumerate(step["racks"]) if r == u["rack"]] for u in flags["uplinks"]],
                  slow_nics=sorted({*(u["rank"] for u in flags["nics"]), *queued}))
    assert plan.rounds == [[tuple(f) for f in flows] for flows in step["rounds"]]
    verdict = judge(plan, observed, [[None if r is None else np.array(r) for r in run] for run in step["gbps"]])
    return Layout.from_spec(case["spec"]), plan, verdict


SLOWED = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["slowed_nic_steps"]


@pytest.mark.parametrize("case", SLOWED, ids=[f"probe{k}" for k in range(len(SLOWED))])
def test_a_recorded_round_slowed_at_a_shared_nic_moves_no_rank_for_sure(case):
    # Recorded (emulated_probes.json "slowed_nic_steps"): a flow out of a NIC another job
    # shares ran below the rate the pairs read that NIC at, and the step took its rank on a
    # rack of its own, confident. The rival still wins, but the rank it moves is unsure.
    assert case["step"]["racks"] == Layout.from_spec(case["spec"]).racks and case["step"]["taken"] is not None
    layout, _, verdict = replayed_step(case)
    assert verdict.racks is None or moved(layout.racks, verdict.racks) <= verdict.shaky, verdict.record()


def test_a_flow_behind_a_slow_nic_counts_only_where_it_ran_faster_than_a_side_predicts():
    pa, pr = np.log([0.20, 0.50, 0.20]), np.log([0.16, 0.50, 0.25])
    m = np.log([0.16, 0.40, 0.22])
    a, r = telling.slowed_at_nic(pa, pr, m, np.array([True, False, True]))
    assert np.allclose(np.exp(a), [0.16, 0.50, 0.20])  # slower than the answer's: no sign against it
    assert np.allclose(np.exp(r), [0.16, 0.50, 0.22])  # faster than the answer's 0.20: still against it
    assert np.allclose(np.exp(telling.slowed_at_nic(pa, pr, m, np.zeros(3, dtype=bool))[0]), np.exp(pa))


def test_a_blind_rank_the_rounds_put_with_clear_ranks_is_placed_in_their_group():
    from dssync.topology.placement import RackFit
    from dssync.topology.telling import adopt_told

    # ranks 0-2 and 4 clear in two groups, rank 3 blind and unplaced (a rack of its own)
    fit = RackFit(n=5, groups=[[0, 1, 2], [4]], blind=[3])
    assert fit.racks() == [0, 0, 0, 1, 2]
    moved = adopt_told(fit, [0, 0, 0, 1, 1])
    assert fit.placed == {3: 1} and fit.racks() == [0, 0, 0, 1, 1]
    assert moved == {3, 4}
    # a rival that leaves the blind rank alone, as it was, does not decide it
    fit = RackFit(n=5, groups=[[0, 1], [2, 4]], blind=[3])
    adopt_told(fit, [0, 0, 0, 1, 0])
    assert 3 not in fit.placed and fit.groups == [[0, 1, 2, 4]]


@pytest.mark.xfail(strict=True, reason="known: the uplink ceiling is below a link the true racks loaded (see "
                   "dssync.topology.telling.uplink_ceiling)")
def test_a_network_where_every_flow_is_held_below_a_nic_keeps_its_racks():
    # 1,1,2, rank 0 behind a 400 Mbit/s uplink, rank 2 behind a 400 Mbit/s NIC: no flow gets
    # more than 0.6 Gbit/s, so every NIC's best is at most that, and the ceiling caps the rack
    # of two's downlink at it, though 0->2 and 1->3 load it with 0.4 + 0.6 at once. The answer
    # then predicts half of that for 1->3, the rival that moves rank 2 the 0.6 measured.
    layout = Layout((1, 1, 2), slow_uplinks={0: "400mbit"}, slow_nics={2: "400mbit"})
    for seed in range(4):
        racks, _, _ = tell(layout, list(layout.racks), seed=seed, slowdown=0.1)
        assert right(layout, racks), (seed, racks)


def test_a_nic_the_pairs_never_saw_used_up_does_not_explain_the_rounds():
    # 2,2 with rank 0 behind a 200 Mbit/s NIC: rank 1 only ever received beside rank 0's flow
    # out of their rack, so the most its NIC was seen to take is 0.8 Gbit/s, and an answer
    # that put rank 1 with the other rack explained that by a slow NIC as well as the network
    # built did by their shared uplink. A NIC that no rule flags is as fast as the fastest seen.
    # The pairs' rates are the probe's own on the emulated racks (four ranks have only three
    # ways to pair up, so every pass met rank 1 beside rank 0); the rounds' rates are the
    # model's at the 0.956 Gbit/s a clear flow got there, slowed by up to 10 %.
    layout = Layout((2, 2), slow_nics={0: "200mbit"})
    wrong = [0, 1, 1, 1]
    assert not right(layout, wrong)
    slow0 = [0.0, 0.191, 0.191, 0.192]
    passes = [(rounds, np.array([slow0, [0.191, 0.0, 0.765, 0.765], [0.191, 0.76, 0.0, 0.956],
                                 [0.191, 0.761, 0.956, 0.0]]))
              for rounds in ([[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]],
                             [[(3, 0), (2, 1)], [(0, 2), (1, 3)], [(1, 0), (3, 2)]])]
    for seed in range(5):
        racks, _, _ = tell(layout, wrong, seed, slowdown=0.1, passes=passes, scale=0.956)
        assert right(layout, racks), (seed, racks)
        racks, _, _ = tell(layout, wrong, seed, slowdown=0.1, passes=passes, scale=0.956, floors=False)
        assert not right(layout, racks), (seed, racks)  # each NIC at the most it carried: the answer stays


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=3).filter(lambda s: 4 <= sum(s) <= 8),
       busy=st.integers(0, 2), slow_nic=st.integers(-1, 7), move=st.integers(0, 7), seed=st.integers(0, 2**16))
def test_no_round_crosses_a_flagged_uplink_as_the_answer_or_a_rival_it_tells_has_it(sizes, busy, slow_nic, move, seed):
    # Another job's flows out of a rack set rates no capacity predicts, and a flow into that
    # rack too (its acks queue behind them): no telling flow crosses that rack's boundary,
    # neither as the answer has it nor as a rival the round tells has it.
    n = sum(sizes)
    layout = Layout(tuple(sizes), uplink_flows=(busy % len(sizes),),
                    slow_nics={slow_nic: "400mbit"} if 0 <= slow_nic < n else {})
    racks = list(layout.racks)
    racks[move % n] = (racks[move % n] + 1) % len(sizes)  # an answer one move away
    flagged = [i for i, r in enumerate(layout.racks) if r == busy % len(sizes)]
    plan = design(racks, concurrent_flows(measured(layout, seed)), list(range(n)), avoid=[flagged], slow_nics=[])
    for k, flows in enumerate(plan.rounds):
        for labels in [plan.answer, *(plan.rivals[r][0] for r in plan.told[k])]:
            inside = {i for i, r in enumerate(labels) if r in {labels[j] for j in flagged}}
            assert not any((s in inside) != (d in inside) for s, d in flows), (labels, flows)


def test_a_round_whose_best_two_runs_disagree_runs_again_and_the_best_two_decide():
    # 4,4 with rank 1 behind a 400 Mbit/s NIC, written in a rack of its own: the rounds that
    # tell its rack, run once with every flow halved by a busy host and once clean, say
    # nothing; a third, clean run agrees with the second, and they decide as two clean runs do.
    layout = Layout((4, 4), slow_nics={1: "400mbit"})
    wrong = [0, 1, 0, 0, 2, 2, 2, 2]
    observed = concurrent_flows(measured(layout, 0))
    plan = design(wrong, observed, list(range(8)), slow_nics=[1])
    assert plan.rounds
    net = true_network(layout)
    clean = [np.asarray(net.rates(flows)) for flows in plan.rounds]
    hiccup = [rates * 0.5 for rates in clean]
    assert unsteady([hiccup, clean]) == list(range(len(plan.rounds)))
    assert judge(plan, observed, [hiccup, clean]).racks is None
    again = [hiccup, clean, list(clean)]
    assert unsteady(again) == []
    verdict = judge(plan, observed, again)
    assert verdict.racks is not None and verdict.record() == judge(plan, observed, [clean, clean]).record()
    assert unsteady([clean, [r * 0.97 for r in clean]]) == []  # within 5 %: no third run


def test_of_the_rivals_every_round_agrees_with_the_fewest_racks_are_taken():
    # 2,5 with the pairs' answer splitting the rack of five (as noise on two cores once did):
    # every telling flow runs unhindered, which the merge explains and so do moves that keep
    # a boundary the rounds never crossed; taking the move the pairs preferred, step after
    # step, kept a split. The merge claims no boundary that nothing showed.
    layout = Layout((2, 5))
    split = [0, 0, 1, 2, 2, 1, 1]
    assert not right(layout, split)
    for seed in range(4):
        racks, _, _ = tell(layout, split, seed, slowdown=0.1)
        assert right(layout, racks), (seed, racks)


def test_a_rack_of_one_whose_uplink_the_pairs_never_filled_keeps_its_racks():
    # 2,1,2 with rack 0 behind a 400 Mbit/s uplink and worker 4 behind a 400 Mbit/s NIC: in
    # every round of the pairs worker 2's flow into the rack of two ran beside a 0.4 Gbit/s
    # flow into it, so rank 2's uplink reads 0.56. A round with 2->3 alone across it gets 1.0,
    # which the racks that were built predict at 0.56 and the merge of 2 into the rack of two
    # at 0.93: the rounds took the merge, on runs with no noise at all, until a rate a round
    # measured was taken as a lower bound on every link of its path, under each answer
    # (below the ceiling, ``telling._raised``).
    layout = Layout((2, 1, 2), slow_uplinks={0: "400mbit"}, slow_nics={4: "400mbit"})
    assert mispredicted(layout, 61310)
    racks, _, _ = tell(layout, list(layout.racks), seed=61310, slowdown=0.0)
    assert right(layout, racks), racks


def test_a_nic_an_earlier_step_s_round_showed_fast_is_predicted_so_in_the_next():
    # 2,1,1 with the rack of one behind a 400 Mbit/s uplink and worker 0 behind a 250 Mbit/s
    # NIC: four workers pair up in three ways, each putting a slow flow beside the other, so
    # no NIC was seen above 0.75 Gbit/s while rack 0's uplink carried 1.0 at once. From the
    # racks the probe wrote in every sweep (worker 0 alone), the first step's rounds ran 3->1
    # at a NIC's rate and took workers 2 and 3 as one rack (the same network: only rack 0
    # sends into it); the second then read 1->3 at the 0.75 its share of rack 0's uplink left
    # as NICs of 0.75 with no uplink between them, and merged all four, unless the NICs stand
    # at the fastest any round so far showed. (Offline, over 12 seeds each: right on all 12 with
    # flows slowed by up to 3-7 %, 10-11 by up to 10-15 %; without it on 0-1.)
    layout = Layout((2, 1, 1), slow_uplinks={1: "400mbit"}, slow_nics={0: "250mbit"})
    assert right(layout, [0, 0, 1, 1]) and not right(layout, [0, 0, 0, 0])
    for seed in range(6):
        racks, _, verdicts = tell(layout, [0, 1, 1, 1], seed, slowdown=0.05)
        assert right(layout, racks), (seed, racks, [v.racks for v in verdicts])


def test_recorded_2_1_1_keeps_its_racks_at_the_second_step():
    # The probe's own run of 2,1,1 (v22 seed 0): the first step took workers 2 and 3 as one
    # rack (the same network as the racks built), from rates 3->1 ran at a NIC's 0.95. The
    # second step's round put 1->3 beside 0->2 and got 0.72, what rack 0's uplink left: with
    # the NICs at the pairs' best alone (0.72, never seen faster) the merge of all four
    # explained it; with the floor the first step showed, the racks kept predict 0.71 and
    # worker 1 alone 0.72, alike within what two runs resolve, which tells neither.
    case = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["floor_steps"]
    layout = Layout.from_spec(case["spec"])
    observed = concurrent_flows([([[tuple(f) for f in flows] for flows in p["rounds"]], np.array(p["gbps"]))
                                 for p in case["pair_rates"]])
    bw, queued = np.array(case["bandwidth_gbps"]), queued_ranks(np.array(case["latency_us"]))
    history, verdicts = [], []
    for step in case["steps"]:
        flags = classify_contention(bw, step["racks"], queued=queued)
        plan = design(step["racks"], observed, [i for i in range(4) if i not in queued],
                      avoid=[[i for i, r in enumerate(step["racks"]) if r == u["rack"]] for u in flags["uplinks"]],
                      slow_nics=sorted({*(u["rank"] for u in flags["nics"]), *queued}))
        assert plan.rounds == [[tuple(f) for f in flows] for flows in step["rounds"]]
        runs = [[np.array(r) for r in row] for row in step["gbps"]]
        verdicts.append((judge(plan, observed, runs, [], history), judge(plan, observed, runs, [], [])))
        history += verdicts[-1][0].ran
    (first, _), (second, alone) = verdicts
    assert first.racks == (0, 0, 1, 1) and right(layout, list(first.racks))
    assert second.racks is None  # the racks kept
    assert alone.racks is not None and not right(layout, list(alone.racks))  # without the first step's floor


@pytest.mark.parametrize("slowed", [0.93, 0.97])
def test_a_rival_fitted_to_a_slowed_flow_by_its_own_rate_does_not_take_it(slowed):
    # 2,3,4 with rack 1 behind a 400 Mbit/s uplink and rank 0 behind a 400 Mbit/s NIC, the
    # racks built as the answer (hypothesis drew it, seed 9365). The round 0->5 beside 6->1
    # tells the split of rack 0: rank 1 alone, whose downlink the pairs read at 0.76 (every
    # flow into it shared rack 0's downlink), predicts 6->1 at that, the racks built at 0.96.
    # 6->1 slowed a few per cent by a busy host lands between them; raised to that rate by
    # the flow itself, rank 1 alone predicted it exactly and was taken.
    layout = Layout((2, 3, 4), slow_uplinks={1: "400mbit"}, slow_nics={0: "400mbit"})
    truth = list(layout.racks)
    observed = concurrent_flows(measured(layout, 9365))
    flagged = [[2, 3, 4]]  # rack 1's uplink, as the pairs flag it: no round crosses it
    plan = design(truth, observed, list(range(9)), slow_nics=[0], avoid=flagged)
    split = (0, 1, 2, 2, 2, 3, 3, 3, 3)
    assert any(plan.rivals[r][0] == split for told in plan.told for r in told)
    net = true_network(layout)
    runs = [[np.asarray(net.rates(flows)) * slowed for flows in plan.rounds]] * 2
    assert judge(plan, observed, runs).racks is None


def test_a_flow_a_round_ran_bounds_each_link_of_its_path_from_below_and_a_rounds_sum_does_not():
    from dssync.topology.telling import _raised

    caps = {("out", 0): 0.3, ("in", 2): 1.0, ("up", (0, 1)): 0.3, ("down", (2, 3)): 1.0, ("out", 1): 1.0,
            ("in", 3): 1.0}
    labels = [0, 0, 1, 1]
    # two flows of 0.25 out of rack (0, 1) at once: each is below what its links were read at
    # (their 0.5 together on the uplink is no bound: the round would fit it to itself)
    shared = _raised(labels, caps, [([(0, 2)], np.array([0.25])), ([(1, 3)], np.array([0.25]))], ceiling=0.8)
    assert shared == caps
    # one flow of 0.9 from 0 to 2: its NIC to 0.9, the uplink to the ceiling, no link added
    alone = _raised(labels, caps, [([(0, 2)], np.array([0.9]))], ceiling=0.8)
    assert alone == {**caps, ("out", 0): 0.9, ("up", (0, 1)): 0.8}
    # a link no capacity was read for (rank 3's NIC out) stays unbounded
    assert ("out", 3) not in _raised(labels, caps, [([(3, 0)], np.array([0.9]))], ceiling=0.8)


def test_a_rival_that_keeps_two_blind_ranks_together_apart_from_every_clear_rank_is_adopted():
    # the pairs put blind ranks 3 and 4 in a rack of their own; the rival also moves clear
    # rank 2 out of the rack of three, so it is adopted, and reassessing the blind ranks takes
    # them out of the groups: they are then with no clear rank, and stay as reassessed (a
    # v17 probe-layouts sweep stopped on a StopIteration here)
    from dssync.topology.placement import RackFit
    from dssync.topology.telling import adopt_told

    def reassess(fit):  # what placement.reassess_blind does first: blind ranks out of the groups
        fit.groups = [g for g in ([i for i in members if i not in fit.blind] for members in fit.groups) if g]
        for j in fit.blind:
            fit.placed.pop(j, None)

    fit = RackFit(n=5, groups=[[0, 1, 2], [3, 4]], blind=[3, 4], placed={3: 1, 4: 1})
    moved = adopt_told(fit, [0, 0, 1, 2, 2], reassess)
    assert fit.groups == [[0, 1], [2]] and 3 not in fit.placed and 4 not in fit.placed
    assert moved >= {2}


def _hiccup(layout: Layout, flows: list, slowed: int, share: float) -> np.ndarray:
    """The bench model's rates of ``flows`` at once with flow ``slowed`` held by its host to
    ``share`` of its rate: the flows that share a link with it take what it leaves there."""
    from dssync.bench.same_network import max_min_rates

    net = true_network(layout)
    crossing = [list(net._crossing.get(tuple(f), ())) for f in flows]
    held = share * net.rates(flows)[slowed]
    crossing[slowed].append(len(net.links))
    return np.asarray(max_min_rates(crossing, [link.gbps for link in net.links] + [held],
                                    [link.background for link in net.links] + [0]))


@pytest.mark.parametrize("sizes", [(2, 2, 3), (3, 2, 4), (4, 2, 3)])
@pytest.mark.parametrize("nic", ["150mbit", "400mbit"])
@pytest.mark.parametrize("seed", [0, 1])
def test_what_a_slowed_flow_leaves_to_the_flow_beside_it_does_not_keep_a_rack_split(sizes, nic, seed):
    # A rack of two whose first rank is behind a slow NIC, split by the pairs' answer: the
    # rounds send a flow into each of the two at once, and the two share the rack's downlink.
    # In the first run a host holds one flow of each round back and the flow beside it takes
    # what it left; the reruns are clean. Each flow's best over the runs then lies between the
    # rack split and kept (on the emulated racks: 0.37/0.69 between 0.38/0.93 and 0.38/0.57),
    # and the rounds said nothing; the rate two runs reached is the network's.
    layout = Layout(sizes, slow_nics={sizes[0]: nic})
    split = [r + (r >= 1) for r in layout.racks]
    split[sizes[0] + 1] = 1
    observed = concurrent_flows(measured(layout, seed))
    plan = design(split, observed, list(range(len(split))), slow_nics=[sizes[0]])
    assert plan.rounds
    net = true_network(layout)
    rng = np.random.default_rng(seed)

    def clean(flows: list) -> np.ndarray:
        return np.asarray(net.rates(flows)) * rng.uniform(0.98, 1.0, len(flows))

    runs = [[_hiccup(layout, flows, int(rng.integers(len(flows))), rng.uniform(0.5, 0.8)) for flows in plan.rounds],
            [clean(flows) for flows in plan.rounds]]
    while len(runs) < MAX_RUNS and (again := unsteady(runs)):
        runs.append([clean(flows) if k in again else None for k, flows in enumerate(plan.rounds)])
    verdict = judge(plan, observed, runs)
    assert verdict.racks is not None and right(layout, list(verdict.racks)), verdict.scores


TIED = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["tied_telling_steps"]


@pytest.mark.parametrize("step", TIED[:2], ids=["2,1,4", "1,3,2"])
def test_of_the_rivals_the_rounds_cannot_tell_apart_the_one_the_pairs_explain_better_is_taken(step, monkeypatch):
    # Recorded on the emulated racks (a 2,1,4 and a 1,3,2, each with a 400 Mbit/s NIC): the
    # first telling step's rounds explain the racks built as well as a merge with one rack
    # fewer, which the probe took; the pairs' flows explain the racks built better by 1 to 2,
    # well beyond what tells rivals the rounds call alike apart.
    layout = Layout.from_spec(step["spec"])
    passes = [([[tuple(f) for f in flows] for flows in rnd["rounds"]], np.array(rnd["gbps"])) for rnd in step["pair_rates"]]
    observed = concurrent_flows(passes)
    racks = step["racks"]
    queued = queued_ranks(np.array(step["latency_us"]))
    flags = classify_contention(np.array(step["bandwidth_gbps"]), racks, queued=queued)
    plan = design(racks, observed, sorted(set(range(len(racks))) - set(queued)),
                  avoid=[[i for i, r in enumerate(racks) if r == u["rack"]] for u in flags["uplinks"]],
                  slow_nics=sorted({*(u["rank"] for u in flags["nics"]), *queued}))
    assert plan.rounds == [[tuple(f) for f in flows] for flows in step["rounds"]]  # the rounds the probe ran
    measured = [[None if rates is None else np.array(rates) for rates in run] for run in step["gbps"]]
    verdict = judge(plan, observed, measured)
    assert verdict.racks is not None and right(layout, list(verdict.racks)), verdict.racks
    assert any(not right(layout, list(labels)) and len(set(labels)) < len(set(verdict.racks)) for labels in verdict.tied)
    monkeypatch.setattr(telling, "ALIKE_MISFIT", math.inf)  # fewest racks first, whatever the pairs say
    fewest = judge(plan, observed, measured)
    assert not right(layout, list(fewest.racks)), fewest.racks


def test_a_rival_the_last_verdict_could_not_tell_from_the_one_it_took_is_told_first():
    # 1,2,5 with workers 1 and 6 behind 200 Mbit/s NICs and worker 7's host busy, recorded on
    # the emulated racks: from worker 0 written with worker 2, the rounds took the merge of
    # worker 0 and the rack of two, which they could not tell from the racks built, and the
    # next step, the last, had room for the rivals of the rack of five only. Told first, the
    # racks built are taken back in the two steps the probe had left.
    step = TIED[2]
    layout = Layout.from_spec(step["spec"])
    truth = tuple(layout.racks)
    passes = [([[tuple(f) for f in flows] for flows in rnd["rounds"]], np.array(rnd["gbps"])) for rnd in step["pair_rates"]]
    observed = concurrent_flows(passes)
    merged = [0, 0, 0, 1, 1, 1, 1, 1]
    plan = design(merged, observed, list(range(8)), slow_nics=[1, 6])
    assert truth in plan.unrun  # no room for it with the rivals of the rack of five first
    first = design(merged, observed, list(range(8)), slow_nics=[1, 6], first=[truth])
    assert truth in [first.rivals[k][0] for k in first.told[0]]
    kept = 0
    for seed in range(6):
        racks, _, verdicts = tell(layout, step["racks"], seed, slowdown=0.1, passes=passes, steps=2)
        assert right(layout, racks), (seed, racks, [v.racks for v in verdicts])
        assert verdicts[0].racks == tuple(merged) and truth in verdicts[0].tied
        racks, _, _ = tell(layout, step["racks"], seed, slowdown=0.1, passes=passes, steps=2, carry=False)
        kept += not right(layout, racks)
    assert kept  # without it, the merge stays


def test_on_random_layouts_the_pairs_margin_and_the_tied_rivals_end_right_at_least_as_often(monkeypatch):
    # Layouts drawn at random (2-4 racks of 1-4 workers, up to two slow NICs and one slow
    # uplink), each started one move away from the racks built, the rounds rated by the
    # bench's link model with 10 % noise: judged with the pairs' margin and telling the tied
    # rivals first, the steps end at a right answer at least as often as with the fewest
    # racks first and no carrying over.
    rng = random.Random(20261130)
    cases = []
    while len(cases) < 30:
        sizes = tuple(rng.randint(1, 4) for _ in range(rng.randint(2, 4)))
        n = sum(sizes)
        if not 4 <= n <= 9:
            continue
        nics = {i: rng.choice(["150mbit", "200mbit", "400mbit"]) for i in rng.sample(range(n), rng.randint(0, 2))}
        uplinks = {r: rng.choice(["200mbit", "400mbit"]) for r in rng.sample(range(len(sizes)), rng.randint(0, 1))}
        layout = Layout(sizes, slow_uplinks=uplinks, slow_nics=nics)
        racks = list(layout.racks)
        k = rng.randrange(n)  # one worker moved: into another rack or alone
        racks[k] = rng.choice([r for r in set(racks) if r != racks[k]] + [max(racks) + 1])
        if not right(layout, racks):
            cases.append((layout, racks, rng.randint(0, 10**6)))
    now = sum(right(layout, tell(layout, racks, seed, slowdown=0.1)[0]) for layout, racks, seed in cases)
    monkeypatch.setattr(telling, "ALIKE_MISFIT", math.inf)
    before = sum(right(layout, tell(layout, racks, seed, slowdown=0.1, carry=False)[0]) for layout, racks, seed in cases)
    assert now >= before, (now, before)
    assert now >= 0.6 * len(cases), now


def test_the_answers_left_standing_are_said_as_the_written_racks_differ_from_them():
    racks = [0, 0, 1, 1, 1, 1]
    said = standing_answers(racks, [((0, 0, 0, 0, 0, 0), "untellable"), ((0, 0, 0, 1, 1, 1), "tied"),
                                    ((0, 0, 1, 2, 2, 2), "unrun"), ((0, 0, 1, 1, 1, 0), "doubted")], range(6))
    assert [(a["workers"], a["with"], a["why"]) for a in said] == [
        ([0, 1], [2, 3, 4, 5], "untellable"),  # a merge: the smaller rack joins the larger
        ([2], [0, 1], "tied"),  # a move: the worker that moves, the rack it joins
        ([2], [], "unrun"),  # a split: the part that leaves, not what stays
        ([5], [0, 1], "doubted"),
    ]
    assert said[0]["says"] == "workers 0-1 may be one rack with workers 2-5: no flow the probe could run tells them apart"
    assert said[2]["says"].startswith("worker 2 may be a rack of its own: ")
    # only workers the probe is unsure of; each worker set once; the written racks themselves never
    assert standing_answers(racks, [((0, 0, 0, 1, 1, 1), "tied")], [0, 1, 3]) == []
    assert len(standing_answers(racks, [((0, 0, 0, 1, 1, 1), "tied"), ((1, 1, 1, 0, 0, 0), "unrun")], range(6))) == 1
    assert standing_answers(racks, [((5, 5, 2, 2, 2, 2), "tied")], range(6)) == []


def test_a_rival_that_only_a_flow_through_a_flagged_uplink_would_tell_is_left_standing_and_said():
    # 4,2,1 with the rack of one's uplink flagged, uplinks as fast as NICs: the pairs' flows
    # explain worker 6 with the rack of two as well as alone, and every flow that would tell
    # them apart crosses the flagged uplink, so no round runs it; that answer stands beside
    # the racks written, and the probe says so.
    layout = Layout((4, 2, 1))
    racks = list(layout.racks)
    observed = concurrent_flows(measured(layout, 0))
    plan = design(racks, observed, list(range(7)), avoid=[[6]])
    assert not plan.rounds
    standing = alternatives(plan, None)
    fenced = [labels for labels, why in standing if why == "untellable" and 6 in moved(racks, labels)]
    assert fenced, standing
    assert all(why in WHY for _, why in standing)
    said = standing_answers(racks, standing, range(7))
    assert said and all(set(a["workers"]) <= set(range(7)) for a in said)
    from dssync.commands.probe import confidence_lines

    lines = confidence_lines({"unsure": list(range(7)), "alternatives": said})
    assert f"warning: {said[0]['says']}" in lines


def test_a_recorded_probe_names_the_racks_built_among_what_it_could_not_tell():
    # Recorded on the emulated racks: 3,2 with worker 4 behind a 200 Mbit/s NIC and another
    # job on rack 1's uplink. Every flow that would tell workers 3 and 4 together from apart
    # crosses that uplink; the probe wrote them on racks of their own, unsure, and says the
    # racks that were built may be the answer (and nothing else).
    case = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["standing_step"]
    layout, plan, verdict = replayed_step(case)
    standing = alternatives(plan, verdict)
    assert tuple(layout.racks) in [labels for labels, _ in standing]
    said = standing_answers(case["racks"], standing, case["unsure"])
    assert [a["says"] for a in said] == ["worker 4 may be one rack with worker 3: no flow the probe could run tells them apart"]


def test_a_tie_no_later_round_tells_leaves_the_workers_it_moves_unsure():
    # Recorded on the emulated racks (v23 seed 1): 1,3,5 with rack 1's uplink loaded by
    # another job, its worker 2 behind a 150 Mbit/s NIC, another job's flows at worker 6's
    # NIC. The first step took worker 0 into a rack with worker 2, and its rounds explained
    # both alone as well. The next step's rounds tell the new answer from other rivals, not
    # from that one. The probe wrote worker 2 with worker 0, confident, and worker 2 is in
    # rack 1: nothing it measured told that answer from the tie, so both workers are unsure.
    case = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["untold_tie_steps"]
    layout = Layout.from_spec(case["spec"])
    passes = [([[tuple(f) for f in flows] for flows in rnd["rounds"]], np.array(rnd["gbps"])) for rnd in case["pair_rates"]]
    observed = concurrent_flows(passes)
    bw, queued = np.array(case["bandwidth_gbps"]), queued_ranks(np.array(case["latency_us"]))
    movable = [i for i in range(len(layout.racks)) if i not in queued]
    history, tied, plans, verdicts = [], [], [], []
    for step in case["steps"][:2]:
        flags = classify_contention(bw, step["racks"], queued=queued)
        plan = design(step["racks"], observed, movable,
                      avoid=[[i for i, r in enumerate(step["racks"]) if r == u["rack"]] for u in flags["uplinks"]],
                      slow_nics=sorted({*(u["rank"] for u in flags["nics"]), *queued}), first=tied)
        assert plan.rounds == [[tuple(f) for f in flows] for flows in step["rounds"]]  # the rounds the probe ran
        verdict = judge(plan, observed, [[None if r is None else np.array(r) for r in run] for run in step["gbps"]],
                        [], history)
        history += verdict.ran
        tied = verdict.tied
        plans.append(plan)
        verdicts.append(verdict)
    taken, kept = verdicts
    assert taken.racks == tuple(case["steps"][0]["taken"]) and not right(layout, list(taken.racks))
    assert kept.racks is None  # the second step kept the wrong answer
    left = untold_ties(plans[1], taken.tied)
    assert left and all(labels in {lab for lab, _ in plans[1].rivals} for labels in left)
    unsure = set().union(*(moved(taken.racks, labels) for labels in left))
    assert unsure == {0, 2}  # the workers the tie places elsewhere: worker 2, misplaced, among them
    # the tie stands beside the answer, with why, for the topology file and stderr
    said = standing_answers(list(taken.racks), [(labels, "tied") for labels in left], sorted(unsure))
    assert said and all(WHY["tied"] in a["says"] for a in said)


def test_untold_ties_are_the_ties_the_rounds_have_as_rivals_and_do_not_run():
    plan = telling.Design(answer=(0, 0, 1, 1), rounds=[[(0, 2), (1, 3)]],
                          rivals=[((0, 1, 2, 2), {}), ((0, 0, 1, 2), {}), ((0, 1, 1, 1), {})], told=[[0]])
    # told by the round; a rival no round runs; no rival at all (the pairs rule it out);
    # one told, given in another numbering of the same racks
    ties = [(0, 1, 2, 2), (0, 0, 1, 2), (0, 1, 0, 1), (1, 0, 2, 2), (3, 3, 4, 5)]
    assert untold_ties(plan, ties) == [(0, 0, 1, 2)]
    assert untold_ties(plan, []) == []


def test_the_probe_s_steps_leave_a_tie_no_later_round_told_unsure_and_standing(monkeypatch):
    # The same recorded 1,3,5 through the probe's own steps (``_tell``) on one rank, each
    # round's rates the ones recorded: the written answer is the recorded one, and workers 0
    # and 2 are unsure with the tie standing beside it, where the probe wrote them confident.
    from dssync.probing import probe
    from dssync.topology.placement import RackFit, reassess_blind

    case = json.loads((Path(__file__).parent / "data" / "emulated_probes.json").read_text())["untold_tie_steps"]
    raw = [([[tuple(f) for f in flows] for flows in rnd["rounds"]], np.array(rnd["gbps"])) for rnd in case["pair_rates"]]
    bw, latency = np.array(case["bandwidth_gbps"]), np.array(case["latency_us"])
    runs = iter([(step["rounds"][k], rates) for step in case["steps"] for run in step["gbps"]
                 for k, rates in enumerate(run) if rates is not None])

    def phase(comm, link, flows, cfg, what):
        want, rates = next(runs)
        assert [list(f) for f in flows] == want  # the round the probe ran next
        return dict(zip(flows, rates, strict=True)), {}

    class OneRank:
        rank, world_size = 0, 9

        def allgather_object(self, obj):
            return [obj]

        def barrier(self):
            pass

    monkeypatch.setattr(probe, "concurrent_phase", phase)
    fit = RackFit(n=9, groups=[[0, 4, 5, 6, 7, 8], [1, 3]], blind=[2], candidates={2: [0, 1]}, metric="bandwidth")
    assert fit.racks() == case["steps"][0]["racks"]
    hosts = [f"w{i}" for i in range(9)]
    steps, standing = probe._tell(OneRank(), None, probe.ProbeConfig(), fit, raw,
                                  lambda f: reassess_blind(f, bw, latency, hosts), bw, queued_ranks(latency), hosts)
    assert [s["taken"] for s in steps] == [s["taken"] for s in case["steps"]]  # the steps as the probe took them
    assert fit.racks() == case["steps"][0]["taken"]
    assert {0, 2} <= fit.unexplained
    assert (tuple(case["steps"][0]["tied"][0]), "tied") in standing
