"""The layout generator and the fluid model that decides when two rack answers are the same network."""

import pytest

from dssync.bench.probe_layouts import Layout, equivalent, fair_rates, generate, score


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


def test_the_generator_is_seeded_and_keeps_its_rules():
    assert generate(5, seed=3) == generate(5, seed=3)
    for layout in generate(200, seed=11):
        assert 2 <= len(layout.rack_sizes) <= 4 and 4 <= sum(layout.rack_sizes) <= 9
        assert all(1 <= size <= 5 for size in layout.rack_sizes)
        if layout.slow_uplinks:
            assert len(layout.rack_sizes) >= 3
        assert all(layout.rack_sizes[r] >= 2 for r in layout.contended_uplinks)
        clear = [i for i in range(sum(layout.rack_sizes)) if i not in layout.contended_nics]
        assert len(clear) >= 3
        for r in layout.contended_uplinks:
            assert any(layout.racks[i] == r for i in clear)


def test_score_counts_a_confident_wrong_answer_and_an_equivalent_one():
    layout = Layout((1, 5, 1), uplink_flows=(1,))
    topo = {"workers": [{"rack": r} for r in [0, 1, 1, 1, 1, 1, 0]],
            "contention": {"uplinks": [], "nics": []}, "probe": {"seconds": 5.0},
            "confidence": {"confident": True, "unplaced": []}}
    row = score(layout, topo)
    assert not row["racks_exact"] and row["racks_equivalent"]
    assert row["wrong_with_confidence"] and not row["telling_wrong_with_confidence"]
    # rack 1's uplink missed: the flags are wrong in both senses
    assert row["uplinks_exact"] is False and not row["flags_equivalent"]
    # flagged on the found rack whose workers are rack 1's: the same link, though not the same rack number
    topo["contention"]["uplinks"] = [{"rack": 1, "bandwidth_gbps": 0.3}]
    row = score(layout, topo)
    assert row["uplinks_found"] is None and row["flags_equivalent"]
    topo["contention"]["uplinks"] = [{"rack": 0, "bandwidth_gbps": 0.3}]  # the merged racks of one instead
    assert not score(layout, topo)["flags_equivalent"]
    topo["contention"] = {"uplinks": [{"rack": 1, "bandwidth_gbps": 0.3}], "nics": [{"rank": 2, "bandwidth_gbps": 0.2}]}
    assert not score(layout, topo)["flags_equivalent"]  # a NIC flagged that is not contended
