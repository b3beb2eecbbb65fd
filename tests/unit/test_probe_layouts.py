"""The layout generator and the fluid model that decides when two rack answers are the same network."""

import re

import pytest

from dssync.bench.probe_layouts import (
    KINDS,
    Layout,
    ProbeFailedError,
    equivalent,
    fair_rates,
    generate,
    kinds,
    score,
    summarize,
)


def test_fair_rates_fill_the_tightest_link_first():
    # a and b share link X (1.0); b and c share Y (0.4): Y fills first (0.2 each), a takes the rest of X
    rates = fair_rates([["X"], ["X", "Y"], ["Y"]], {"X": 1.0, "Y": 0.4})
    assert rates == pytest.approx([0.8, 0.2, 0.2])
    assert fair_rates([["free"]], {}) == [float("inf")]
    assert fair_rates([["X"]] * 4, {"X": 1.0}) == pytest.approx([0.25] * 4)


def test_racks_that_change_what_a_flow_gets_are_not_equivalent():
    layout = Layout((4, 2))
    assert equivalent(layout, [0, 0, 0, 0, 1, 1])
    assert not equivalent(layout, [0] * 6)  # two flows across no longer halve
    assert not equivalent(layout, [0, 0, 1, 1, 2, 2])  # half of rack 0 moved next to rack 1's uplink


def test_racks_no_flow_tells_apart_are_equivalent():
    # A rack of one behind an uplink as fast as its NIC acts like a host on the spine: with
    # one other rack only, everything it sends or gets goes through that rack's uplink anyway.
    assert equivalent(Layout((1, 5, 1), uplink_flows=(1,)), [0, 1, 1, 1, 1, 1, 0])
    # With two racks, splitting one into racks of one changes nothing: every flow leaving
    # them still shares the other rack's uplink.
    assert equivalent(Layout((4, 2)), [0, 1, 2, 3, 4, 4])
    # Merging the racks on either side of a slow uplink speeds up every flow that crossed it.
    assert not equivalent(Layout((5, 3), slow_uplinks={1: "200mbit"}), [0, 0, 0, 0, 1, 1, 1, 1])


def test_the_generator_is_seeded_and_draws_within_its_bounds():
    assert generate(5, seed=3) == generate(5, seed=3)
    assert generate(5, seed=3) != generate(5, seed=4)
    for layout in generate(200, seed=11):
        n = sum(layout.rack_sizes)
        assert 2 <= len(layout.rack_sizes) <= 4 and 4 <= n <= 9
        assert all(1 <= size <= 5 for size in layout.rack_sizes)
        assert all(0 <= r < len(layout.rack_sizes) for r in [*layout.slow_uplinks, *layout.uplink_flows])
        assert all(0 <= i < n for i in [*layout.slow_nics, *layout.nic_flows, *layout.busy_cpus])
        assert not set(layout.slow_nics) & set(layout.nic_flows)
    assert all(sum(layout.rack_sizes) <= 6 for layout in generate(50, seed=1, max_workers=6))
    with pytest.raises(ValueError):
        generate(0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 7, 11, 2026])
def test_every_kind_is_in_at_least_three_of_every_twenty_layouts(seed):
    layouts = generate(60, seed=seed)
    for block in (layouts[:20], layouts[20:40], layouts[40:]):
        for kind in KINDS:
            assert sum(kind in kinds(layout) for layout in block) >= 3, (seed, kind)


def test_the_generator_leaves_out_no_hard_layout():
    layouts = generate(400, seed=0)
    # the kinds the old rules redrew away: a slow uplink between two racks or on a rack of
    # one, another job's flows leaving a rack of one, a rack with a contended uplink whose
    # every NIC is contended too
    assert any(layout.slow_uplinks and len(layout.rack_sizes) == 2 for layout in layouts)
    assert any(layout.rack_sizes[r] == 1 for layout in layouts for r in layout.slow_uplinks)
    assert any(layout.rack_sizes[r] == 1 for layout in layouts for r in layout.uplink_flows)
    assert any(all(layout.racks[i] != r or i in layout.contended_nics for i in range(len(layout.racks)))
               for layout in layouts for r in layout.contended_uplinks)
    assert any(len(layout.busy_cpus) == 2 for layout in layouts)


def test_kinds_name_what_a_layout_holds():
    assert kinds(Layout((4, 2), slow_nics={5: "200mbit"})) == ["slow_nic_in_rack_of_two", "uplinks_at_nic_speed"]
    assert kinds(Layout((3, 3), slow_uplinks={0: "300mbit"}, busy_cpus=(1,))) == ["slow_uplink", "busy_cpu"]
    assert kinds(Layout((5, 3), slow_nics={1: "150mbit"}, uplink_flows=(1,))) == ["unequal_racks_slow_nic_busy_uplink"]
    assert Layout((2, 2), busy_cpus=(0, 3)).describe() == "2,2 cpu:0 cpu:3"


@pytest.mark.parametrize("seed", [0, 7, 20261130])
def test_a_layout_reads_back_from_the_text_the_table_writes(seed):
    # every kind the generator draws, on seeds the records do not use
    for layout in generate(40, seed):
        assert Layout.parse(layout.describe()) == layout, layout.describe()
    assert Layout.parse("3,1 uplink1=400mbit nic0=150mbit rack:0 nic:2 cpu:3 cpu:1") == Layout(
        (3, 1), slow_uplinks={1: "400mbit"}, slow_nics={0: "150mbit"}, uplink_flows=(0,), nic_flows=(2,),
        busy_cpus=(3, 1))


@pytest.mark.parametrize(("text", "says"), [
    ("", "starts with the rack sizes"), ("2,0 rack:0", "starts with the rack sizes"),
    ("2,2 racks:0", "'racks:0'"), ("2,2 rack:2", "racks are 0..1"), ("2,2 cpu:4", "ranks are 0..3"),
    ("2,2 uplink0=fast", "'uplink0=fast'")])
def test_a_layout_that_cannot_be_read_says_which_part(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        Layout.parse(text)


def _topology(racks, uplinks=(), nics=(), confident=True):
    return {"workers": [{"rank": i, "rack": r} for i, r in enumerate(racks)],
            "contention": {"uplinks": [{"rack": r, "bandwidth_gbps": 0.3} for r in uplinks],
                           "nics": [{"rank": i, "bandwidth_gbps": 0.2} for i in nics]},
            "probe": {"seconds": 5.0}, "confidence": {"confident": confident, "unplaced": []}}


def test_score_counts_a_confident_wrong_answer_and_an_equivalent_one():
    layout = Layout((1, 5, 1), uplink_flows=(1,))
    topo = _topology([0, 1, 1, 1, 1, 1, 0])
    row = score(layout, topo)
    assert not row["racks_exact"] and row["racks_equivalent"] and row["racks_same_network"]
    assert row["wrong_with_confidence"] and not row["telling_wrong_with_confidence"]
    # rack 1's uplink missed: the flags are wrong in every sense, and so is the answer
    assert row["uplinks_exact"] is False and not row["flags_equivalent"] and not row["flags_right"]
    assert not row["exact"] and not row["same_network"] and not row["right"] and row["wrong_confident"]
    assert "Gbit/s" in row["difference"]
    assert row["wrong_only_through_other_jobs"]  # every flow it mispredicts leaves rack 1
    # flagged on the found rack whose workers are rack 1's: the same link, though not the same rack number
    row = score(layout, _topology([0, 1, 1, 1, 1, 1, 0], uplinks=[1]))
    assert row["uplinks_found"] is None and row["flags_equivalent"] and row["flags_right"]
    assert not row["exact"] and row["same_network"] and row["right"] and not row["wrong_confident"]
    assert row["difference"] is None and not row["wrong_only_through_other_jobs"]
    # The merged racks of one flagged instead: not rack 1's workers, but every flow into the
    # merged rack comes out of rack 1, so its uplink's way in is rack 1's way out.
    row = score(layout, _topology([0, 1, 1, 1, 1, 1, 0], uplinks=[0]))
    assert not row["flags_equivalent"] and row["same_network"] and row["flags_right"] and row["right"]
    row = score(layout, _topology([0, 1, 1, 1, 1, 1, 0], uplinks=[1], nics=[2]))
    assert not row["flags_equivalent"] and not row["right"]  # a NIC flagged that is not contended
    assert not row["wrong_only_through_other_jobs"]  # 2->3 inside rack 1: 0.2, its NIC as recorded
    row = score(layout, _topology([0, 1, 1, 1, 1, 1, 0], confident=False))
    assert not row["right"] and not row["wrong_confident"]


def test_score_an_exact_answer_and_the_same_network_by_another_link():
    layout = Layout((4, 1), uplink_flows=(0,), busy_cpus=(2,))
    row = score(layout, _topology([0, 0, 0, 0, 1], uplinks=[0]))
    assert row["exact"] and row["same_network"] and row["right"] and row["flags_right"]
    assert row["kinds"] == ["uplinks_at_nic_speed", "busy_cpu"]
    # rank 4's NIC carries what rack 0's uplink does: not exact, the same network, flags right
    row = score(layout, _topology([0, 0, 0, 0, 1], nics=[4]))
    assert not row["exact"] and row["same_network"] and row["right"] and row["flags_right"]
    assert row["uplinks_exact"] is False and not row["nics_exact"]
    summary = summarize([row, score(layout, _topology([0, 0, 0, 0, 1]))])
    assert summary["right"] == summary["same_network"] == summary["flags_right"] == 1
    assert summary["exact"] == 0 and summary["wrong_confident"] == 1 and summary["layouts"] == 2


def test_summarize_reads_records_written_before_the_same_network_rule():
    old = {"racks_exact": True, "uplinks_exact": True, "nics_exact": False, "wrong_with_confidence": False,
           "confident": True, "flags_true_positive": 1, "flags_reported": 1, "flags_true": 2, "probe_seconds": 3.0}
    summary = summarize([old])
    assert summary["exact"] == summary["right"] == 0 and summary["wrong_confident"] == 1


def test_a_layout_whose_probe_failed_is_a_row_of_the_sweep_and_the_others_still_run(monkeypatch, tmp_path, capsys):
    """One worker's crash on one layout is recorded (not right, claiming nothing, why it
    failed), the other layouts are probed and scored, the record rescores as it was, and
    the command says so and exits 1 once the record is written."""
    import json

    from dssync.bench import probe_layouts
    from dssync.cli import main

    layouts = [Layout((2, 2)), Layout((3, 1), uplink_flows=(0,)), Layout((1, 3))]
    probed = []

    def probe(layout, **_):
        probed.append(layout)
        if layout is layouts[1]:
            raise ProbeFailedError("dssync probe failed (exit 1): [w2] RuntimeError: a peer hung up")
        return _topology(list(layout.racks))

    monkeypatch.setattr(probe_layouts, "probe_layout", probe)
    result = probe_layouts.run_layouts(layouts)
    assert probed == layouts and result["topologies"][1] is None
    rows = result["rows"]
    assert "a peer hung up" in rows[1]["failed"] and not rows[1]["right"] and not rows[1]["wrong_confident"]
    assert [r["right"] for r in rows] == [True, False, True] and rows[1]["flags_true"] == 1
    summary = result["summary"]
    assert summary["failed"] == 1 and summary["right"] == 2 and summary["wrong_confident"] == 0
    assert summary["probe_seconds_median"] == 5.0  # the failed layout has no seconds
    assert probe_layouts.rescore(result)["rows"] == rows
    record = tmp_path / "sweep.json"
    record.write_text(json.dumps({"command": "dssync bench probe-layouts --count 3 --seed 7", **result}))
    assert main(["bench", "probe-layouts", "--rescore", str(record)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "a peer hung up" in out and "1 of 3 probes FAILED" in out


def test_one_layout_built_once_is_probed_again_and_again_on_the_same_cluster(monkeypatch):
    import contextlib

    from dssync.bench import probe_layouts

    layout = Layout((2, 2), uplink_flows=(0,))
    events = []

    @contextlib.contextmanager
    def built(lay, **_):
        events.append(("up", lay))
        yield
        events.append(("down", lay))

    def probe_built(**_):
        events.append(("probe",))
        if len(events) == 3:
            raise ProbeFailedError("dssync probe failed (exit 1): [w1] timed out")
        return _topology([0, 1, 1, 1], uplinks=[1], confident=True)

    monkeypatch.setattr(probe_layouts, "built", built)
    monkeypatch.setattr(probe_layouts, "probe_built", probe_built)
    result = probe_layouts.run_layouts([layout] * 3, built_once=True)
    assert events == [("up", layout), ("probe",), ("probe",), ("probe",), ("down", layout)]
    rows = result["rows"]
    assert "timed out" in rows[1]["failed"] and result["topologies"][1] is None  # the others still probed
    assert result["summary"]["wrong_confident"] == 2 and result["summary"]["failed"] == 1
    with pytest.raises(ValueError, match="one layout"):
        probe_layouts.run_layouts([layout, Layout((2, 2))], built_once=True)
