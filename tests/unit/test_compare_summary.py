"""``bench compare``'s summary, on records whose answers are worked out by hand."""

import pytest

from dssync.bench.compare import markdown_table, summarize


def run(strategy, repeat, comm, wall, curve, scenario="inter-rack"):
    return {"scenario": scenario, "strategy": strategy, "repeat": repeat, "steps": curve[-1][0],
            "comm_ms_per_iter": comm, "wall_s": wall, "best_accuracy": max(a for _, _, a in curve),
            "curve": [{"step": s, "wall_s": w, "accuracy": a} for s, w, a in curve]}


RECORDS = [
    run("ddp", 0, 100.0, 10.0, [(10, 5.0, 0.80), (20, 10.0, 0.90)]),
    run("ddp", 1, 120.0, 12.0, [(10, 6.0, 0.85), (20, 12.0, 0.95)]),
    run("ds-sync", 0, 40.0, 4.0, [(10, 2.0, 0.88), (20, 4.0, 0.93)]),
    run("ds-sync", 1, 60.0, 6.0, [(10, 3.0, 0.91), (20, 6.0, 0.92)]),
    run("asp", 0, 10.0, 1.0, [(10, 0.5, 0.70), (20, 1.0, 0.89)]),
    run("asp", 1, 10.0, 1.0, [(10, 0.5, 0.70), (20, 1.0, 0.91)]),
]


def test_target_is_the_references_lowest_best_and_times_are_medians_over_repeats():
    rows = {r["strategy"]: r for r in summarize(RECORDS)}
    assert rows["ddp"]["target_accuracy"] == pytest.approx(0.90)  # min(0.90, 0.95)
    assert rows["ddp"]["comm_ms_per_iter"] == pytest.approx(110.0)
    assert rows["ds-sync"]["comm_ms_per_iter"] == pytest.approx(50.0)
    # ds-sync reaches 0.90 at step 20 (4.0 s) in repeat 0 and at step 10 (3.0 s) in repeat 1.
    assert rows["ds-sync"]["time_to_target_s"] == pytest.approx(3.5)
    assert rows["ds-sync"]["iterations_to_target"] == pytest.approx(15)
    assert rows["ds-sync"]["reached"] == 2
    assert rows["ddp"]["time_to_target_s"] == pytest.approx(11.0)  # 10.0 and 12.0 (0.90 first at step 20)
    assert rows["ds-sync"]["tta_ratio"] == pytest.approx(11.0 / 3.5)
    assert rows["ddp"]["tta_ratio"] == pytest.approx(1.0)
    assert rows["ds-sync"]["wall_ms_per_iter"] == pytest.approx(250.0)  # 4.0 s and 6.0 s over 20 steps
    # asp reaches 0.90 only in repeat 1: no time to target.
    assert rows["asp"]["reached"] == 1
    assert rows["asp"]["time_to_target_s"] is None and rows["asp"]["iterations_to_target"] is None
    assert rows["asp"]["tta_ratio"] is None
    assert rows["asp"]["rank_comm_ms_per_iter"] is None  # no per-rank samples recorded
    assert rows["asp"]["best_accuracy"] == pytest.approx(0.90) and rows["asp"]["best_accuracy_min"] == pytest.approx(0.89)


def test_a_stopped_run_is_timed_per_iteration_it_ran_and_the_target_it_was_stopped_at_wins():
    stopped = [dict(r, steps=1000, steps_run=20, target_accuracy=0.905) for r in RECORDS]
    rows = {r["strategy"]: r for r in summarize(stopped)}
    assert rows["ds-sync"]["target_accuracy"] == pytest.approx(0.905)
    assert rows["ds-sync"]["wall_ms_per_iter"] == pytest.approx(250.0)
    assert rows["ds-sync"]["time_to_target_s"] == pytest.approx(3.5)  # 0.93 at 4.0 s, 0.91 at 3.0 s


def test_per_rank_comm_is_each_ranks_mean_after_warm_up_averaged_over_ranks():
    # 20 steps: the first 2 are warm-up. Rank 0 waits 50 ms every other iteration (its
    # group-mate lags), rank 1 every other one in between: each iteration's maximum is 50,
    # but each rank spends 25 ms per iteration on average.
    by_rank = [[999.0, 999.0] + [50.0, 0.0] * 9, [999.0, 999.0] + [0.0, 50.0] * 9]
    rec = dict(RECORDS[2], comm_ms_by_rank=by_rank)
    rows = {r["strategy"]: r for r in summarize([rec, dict(rec, repeat=1)])}
    assert rows["ds-sync"]["rank_comm_ms_per_iter"] == pytest.approx(25.0)
    assert "| inter-rack | ds-sync | 0/2 | n/a | n/a | n/a | 200.0 | 25.0 | 40.0 | 0.9300 (0.9300) | n/a |" \
        in markdown_table(list(rows.values()))


def test_scenarios_are_summarized_apart_and_the_table_shows_every_row():
    other = [dict(r, scenario="static") for r in RECORDS[:2]]
    rows = summarize(RECORDS + other)
    assert [(r["scenario"], r["strategy"]) for r in rows] == [
        ("inter-rack", "ddp"), ("inter-rack", "ds-sync"), ("inter-rack", "asp"), ("static", "ddp")]
    table = markdown_table(rows).splitlines()
    assert len(table) == 2 + 4
    assert table[3] == ("| inter-rack | ds-sync | 2/2 | 3.5 | 3.14 | 15 | 250.0 | n/a | 50.0 | "
                        "0.9250 (0.9200) | 0.9000 |")
    assert table[4].startswith("| inter-rack | asp | 1/2 | n/a | n/a | n/a | 50.0 |")


def test_without_the_reference_there_is_no_target():
    rows = summarize([r for r in RECORDS if r["strategy"] != "ddp"])
    assert all(r["target_accuracy"] is None and r["tta_ratio"] is None for r in rows)
    rows = summarize(RECORDS, reference="asp")  # another reference: its lowest best, 0.89
    assert rows[0]["target_accuracy"] == pytest.approx(0.89)


def test_a_failed_run_counts_as_a_seed_that_never_reached_and_is_named_under_the_table():
    failed = {"scenario": "inter-rack", "strategy": "asp", "repeat": 2, "error": "rank 4 exited with code 134"}
    rows = {r["strategy"]: r for r in summarize([*RECORDS, failed])}
    assert rows["asp"]["repeats"] == 3 and rows["asp"]["failed"] == 1 and rows["asp"]["reached"] == 1
    assert rows["asp"]["comm_ms_per_iter"] == pytest.approx(10.0)
    assert rows["ds-sync"]["failed"] == 0
    table = markdown_table(list(rows.values()))
    assert table.splitlines()[-1] == ("Left out: inter-rack asp: 1 of 3 runs failed (the error of each is in the "
                                      "JSON records).")


def test_a_strategy_may_carry_train_settings():
    from dssync._text import parse_variant

    assert parse_variant("allreduce") == ("allreduce", [])
    assert parse_variant("psp:push_quorum=6:pull_fraction=0.75") == ("psp", ["push_quorum=6", "pull_fraction=0.75"])
    assert parse_variant(" psp : delay_s=4 :") == ("psp", ["delay_s=4"])


def test_loss_target_counts_iterations_updates_and_aborts_as_medians_over_repeats():
    from dssync.bench.compare import loss_rows, loss_table

    def loss_run(strategy, repeat, points, aborts=None):
        stats = [{"aborts": a, "resyncs_sent": 2 * a} if a is not None else {} for a in (aborts or [None])]
        return {"scenario": "static", "strategy": strategy, "repeat": repeat, "strategy_stats": stats,
                "curve": [{"step": s, "wall_s": w, "updates": u, "loss": loss} for s, w, u, loss in points]}

    records = [
        loss_run("asp", 0, [(10, 1.0, 80, 0.9), (20, 2.0, 160, 0.5), (30, 3.0, 240, 0.3)]),
        loss_run("asp", 1, [(10, 1.0, 80, 0.9), (20, 2.0, 160, 0.7), (30, 3.0, 240, 0.6)]),
        loss_run("specsync", 0, [(10, 1.5, 80, 0.6), (20, 3.0, 160, 0.4), (30, 4.5, 240, 0.2)], [3, 1]),
        loss_run("specsync", 1, [(10, 1.5, 80, 0.5), (20, 3.0, 160, 0.3), (30, 4.5, 240, 0.2)], [5, 1]),
    ]
    rows = {r["strategy"]: r for r in loss_rows(records, 0.5)}
    assert rows["asp"]["reached"] == 1 and rows["asp"]["iterations_to_loss"] is None  # repeat 1 never got there
    assert rows["asp"]["final_loss"] == pytest.approx(0.45)
    assert rows["specsync"]["iterations_to_loss"] == pytest.approx(15)  # steps 20 and 10
    assert rows["specsync"]["updates_to_loss"] == pytest.approx(120)
    assert rows["specsync"]["time_to_loss_s"] == pytest.approx(2.25)
    assert rows["specsync"]["aborts_per_run"] == pytest.approx(5)  # (3 + 1 + 5 + 1) / 2 runs
    assert rows["specsync"]["resyncs_sent_per_run"] == pytest.approx(10)
    assert "| static | specsync | 0.500 | 2/2 | 15 | 120 | 2.2 | 0.200 | 5 | 10 |" in loss_table(list(rows.values()))


def test_seed_rows_pair_each_seed_with_the_references_own_and_mark_stopped_runs():
    from dssync.bench.compare import seed_rows, seed_table

    def rec(strategy, repeat, best, steps_run=20):
        return {"scenario": "static", "strategy": strategy, "repeat": repeat, "steps": 20,
                "steps_run": steps_run, "best_accuracy": best}

    records = [rec("ddp", 0, 0.90), rec("ddp", 1, 0.92), rec("ddp", 2, 0.94),
               rec("ds-sync", 0, 0.91), rec("ds-sync", 1, 0.91, steps_run=12), rec("ds-sync", 2, 0.94),
               rec("asp", 0, 0.80), {"scenario": "static", "strategy": "asp", "repeat": 1, "error": "x"}]
    rows = {r["strategy"]: r for r in seed_rows(records)}
    ds = rows["ds-sync"]
    # differences +0.01, -0.01, 0.00: mean 0, sample std 0.01, t(0.975, 2) = 4.302653
    assert ds["mean_diff"] == pytest.approx(0.0, abs=1e-12)
    half = 4.302653 * 0.01 / 3 ** 0.5
    assert ds["ci95"][0] == pytest.approx(-half, rel=1e-5) and ds["ci95"][1] == pytest.approx(half, rel=1e-5)
    assert ds["at_least_reference"] == 2 and ds["pairs"] == 3 and ds["stopped"] == [1]
    assert rows["asp"]["pairs"] == 1 and rows["asp"]["ci95"] is None  # one seed: no interval
    assert rows["asp"]["mean_diff"] == pytest.approx(-0.10)
    assert rows["ddp"]["mean_diff"] == 0.0 and rows["ddp"]["at_least_reference"] == 3
    table = seed_table(list(rows.values())).splitlines()
    assert table[0].startswith("| scenario | strategy | seed 0 | seed 1 | seed 2 |")
    ds_line = next(line for line in table if "| ds-sync |" in line)
    assert "| 0.9100 | 0.9100† | 0.9400 | +0.000 |" in ds_line and ds_line.endswith("| 2/3 |")
    asp_line = next(line for line in table if "| asp |" in line)
    assert "| 0.8000 | n/a | n/a | -10.000 | n/a | 0/1 |" in asp_line


def five_seeds():
    """ddp's five best accuracies are 0.93, 0.905, 0.91, 0.92, 0.95: the target is 0.905. ds-sync
    misses it in two seeds, gossip in three, local-sgd in none."""
    recs = []
    ddp = {0: [(10, 4.0, 0.85), (20, 8.0, 0.93)], 1: [(10, 4.0, 0.80), (20, 8.0, 0.905)],
           2: [(10, 5.0, 0.91), (20, 10.0, 0.90)], 3: [(10, 4.0, 0.92), (20, 8.0, 0.91)],
           4: [(10, 6.0, 0.95), (20, 12.0, 0.95)]}
    ds = {0: [(10, 1.0, 0.89), (20, 3.0, 0.906)], 1: [(10, 1.0, 0.91), (20, 2.0, 0.92)],
          2: [(10, 2.0, 0.95), (20, 4.0, 0.96)], 3: [(10, 1.0, 0.80), (20, 2.0, 0.904)],
          4: [(10, 1.0, 0.70), (20, 2.0, 0.90)]}
    gossip = {0: [(10, 1.5, 0.91), (20, 3.0, 0.92)], 1: [(10, 1.0, 0.91), (20, 2.0, 0.92)],
              2: [(10, 1.0, 0.89), (20, 2.0, 0.90)], 3: [(10, 1.0, 0.80), (20, 2.0, 0.904)],
              4: [(10, 1.0, 0.70), (20, 2.0, 0.90)]}
    local = {k: [(10, 0.5 * (k + 1), 0.91), (20, 10.0, 0.92)] for k in range(5)}
    for name, runs in (("ddp", ddp), ("ds-sync", ds), ("gossip", gossip), ("local-sgd", local)):
        recs += [run(name, k, 1.0, curve[-1][1], curve) for k, curve in runs.items()]
    return recs


def test_the_target_is_ddps_lowest_best_of_five_seeds_and_tta_a_median_in_which_a_miss_is_never():
    rows = {r["strategy"]: r for r in summarize(five_seeds())}
    assert all(r["target_accuracy"] == pytest.approx(0.905) for r in rows.values())
    # ddp first reaches 0.905 at 8.0 (seed 0), 8.0 (1), 5.0 (2), 4.0 (3), 6.0 (4): median 6.0.
    assert rows["ddp"]["reached"] == 5 and rows["ddp"]["time_to_target_s"] == pytest.approx(6.0)
    # ds-sync: 3.0, 1.0, 2.0, never, never -> sorted 1, 2, 3, inf, inf: median 3.0 at iterations
    # 20, 10, 10, never, never -> 20.
    assert rows["ds-sync"]["reached"] == 3 and rows["ds-sync"]["repeats"] == 5
    assert rows["ds-sync"]["time_to_target_s"] == pytest.approx(3.0)
    assert rows["ds-sync"]["iterations_to_target"] == pytest.approx(20)
    assert rows["ds-sync"]["tta_ratio"] == pytest.approx(2.0)
    assert rows["ds-sync"]["seed_times_to_target_s"] == {0: 3.0, 1: 1.0, 2: 2.0, 3: None, 4: None}
    # gossip reaches in two seeds of five: the median is a miss, so there is no time to target.
    assert rows["gossip"]["reached"] == 2
    assert rows["gossip"]["time_to_target_s"] is None and rows["gossip"]["tta_ratio"] is None
    # local-sgd: 0.5, 1.0, 1.5, 2.0, 2.5 -> 1.5.
    assert rows["local-sgd"]["time_to_target_s"] == pytest.approx(1.5)
    table = markdown_table(list(rows.values()))
    assert "| inter-rack | ds-sync | 3/5 | 3.0 | 2.00 | 20 |" in table
    assert "| inter-rack | gossip | 2/5 | n/a | n/a | n/a |" in table


@pytest.mark.parametrize(("values", "expected"), [
    ([5.0, 1.0, 3.0, None, None], 5.0), ([5.0, 1.0, None, None, None], None), ([2.0, 4.0], 3.0),
    ([2.0, None], None), ([None], None), ([], None), ([7.0], 7.0), ([1.0, 2.0, 3.0, None], 2.5)])
def test_the_median_with_misses_counts_a_miss_as_later_than_every_time(values, expected):
    from dssync.bench.compare import median_with_misses

    assert median_with_misses(values) == (None if expected is None else pytest.approx(expected))


def test_a_resumed_comparison_runs_only_what_the_interrupted_one_had_not(monkeypatch):
    import contextlib

    import dssync.bench.compare as cmp

    ran = []

    def fake_train(cluster, out, strategy, rep, goal, common, **kw):
        ran.append((strategy, rep, goal))
        return dict(run(strategy, rep, 1.0, 3.0, [(10, 1.0, 0.5), (20, 3.0, 0.95)], scenario="static"),
                    task="digits", target_accuracy=goal, provenance={"commit": "job's own"})

    monkeypatch.setattr(cmp.emulate, "cluster", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(cmp.emulate, "contend", lambda **k: None)
    monkeypatch.setattr(cmp, "_train", fake_train)
    old = {"commit": "before"}
    previous = [dict(run("ddp", 0, 1.0, 9.0, [(10, 5.0, 0.8), (20, 9.0, 0.91)], scenario="static"), provenance=old),
                dict(run("ddp", 1, 1.0, 9.0, [(10, 5.0, 0.8), (20, 9.0, 0.93)], scenario="static"), provenance=old),
                dict(run("ds-sync", 0, 1.0, 2.0, [(10, 2.0, 0.92)], scenario="static"), target_accuracy=0.91,
                     provenance=old),
                {"scenario": "static", "strategy": "ds-sync", "repeat": 1, "error": "rank 3 died"}]
    records = cmp.compare(["static"], ["ddp", "ds-sync"], repeats=2, steps=20, previous=previous)
    # ddp's two seeds and ds-sync's seed 0 are kept; the failed seed 1 runs again, at the target
    # the kept ddp runs set (the lower of 0.91 and 0.93).
    assert ran == [("ds-sync", 1, 0.91)]
    assert [(r["strategy"], r["repeat"]) for r in records] == [("ddp", 0), ("ddp", 1), ("ds-sync", 0), ("ds-sync", 1)]
    assert records[2] is previous[2] and "provenance" not in records[3]  # the job's own is dropped
    from dssync.bench.provenance import stamp

    stamped = stamp(records, {"commit": "now"})
    assert [r["provenance"]["commit"] for r in stamped] == ["before", "before", "before", "now"]


def test_plan_rows_count_the_changes_after_the_first_and_name_clear_links_flagged():
    """three-rack's background loads rack 0's uplink and nothing else (its ground truth)."""
    from dssync.bench.compare import plan_rows, plan_table

    def change(step, uplinks, nics, pace):
        return {"step": step, "reason": "x", "schedule": {}, "uplinks": uplinks, "nics": nics, "pace": pace}

    def record(strategy, seed, changes, adjust_every=25):
        return {"scenario": "three-rack", "strategy": strategy, "repeat": seed,
                "config": {"strategy_options": {"adjust_every": adjust_every} if adjust_every else {}},
                "schedule_changes": [change(0, [], [], 1), *changes]}

    steady = record("ds-sync", 0, [change(50, [0], [], 1), change(100, [0], [], 2)])
    flappy = record("ds-sync", 1, [change(50, [0], [], 2), change(75, [0], [4], 1), change(100, [0], [], 2),
                                   change(150, [0, 1], [], 1)])
    rows = plan_rows([steady, flappy, record("ddp", 0, [], adjust_every=0), {"error": "died", "scenario": "x"}])
    assert [(r["seed"], r["after_first"], r["clear_links_flagged"]) for r in rows] == [
        (0, 1, []), (1, 3, ["NIC 4", "uplink 1"])]
    table = plan_table(rows)
    assert "75: up [0], NIC [4], pace 1" in table and "| NIC 4, uplink 1 |" in table
    old = record("ds-sync", 2, [{"step": 50, "reason": "x", "schedule": {}}])  # a record before the flags were kept
    assert plan_rows([old])[0]["clear_links_flagged"] is None
