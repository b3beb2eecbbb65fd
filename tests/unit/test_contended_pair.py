"""The summary of ``python -m dssync.bench.contended_pair`` (the measurement itself needs root
and the emulated cluster; this checks the arithmetic of its record)."""

import pytest

from dssync.bench.contended_pair import MODES, summarize


def op(mode, ms, after, retrans=0, timeouts=0):
    return {"mode": mode, "ms": ms, "rank0_ms": ms, "rank4_ms": ms, "rank4_ends_after_ms": after,
            "retrans_segs": retrans, "timeouts": timeouts}


def test_medians_ranges_and_the_ratio_to_the_pair_alone():
    ops = [op("alone", 400, 100, 5), op("alone", 500, 120, 7), op("alone", 450, 110),
           op("rack-exchange", 900, 480, 1, 1), op("rack-exchange", 1000, 500, 2)]
    got = summarize(ops)
    assert list(got) == ["alone", "rack-exchange"]  # a mode with no ops is left out
    assert got["alone"] == {"ops": 3, "median_ms": 450, "min_ms": 400, "max_ms": 500, "rank4_ends_after_ms": 110,
                            "retrans_segs": 12, "timeouts": 0, "vs_alone": 1.0}
    assert got["rack-exchange"]["median_ms"] == 950 and got["rack-exchange"]["vs_alone"] == pytest.approx(950 / 450, abs=0.005)
    assert got["rack-exchange"]["rank4_ends_after_ms"] == 490 and got["rack-exchange"]["timeouts"] == 1


def test_without_the_pair_alone_no_ratio_is_given():
    got = summarize([op(MODES[1], 900, 480)])
    assert "vs_alone" not in got[MODES[1]]
