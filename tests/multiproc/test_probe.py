"""``dssync probe`` on loopback ranks, and the round-robin schedule it measures in."""

import itertools
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from dssync.errors import DssyncError
from dssync.launch import run_ranks
from dssync.probing.phases import blast_flows, round_robin_rounds
from dssync.topology import Topology

SMALL = ("--message-mb", "0.0625", "--bandwidth-seconds", "0.05", "--latency-reps", "5", "--timeout", "60")


def dssync(*args):
    return subprocess.run([sys.executable, "-m", "dssync.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("relabel", [0, 1, 7])
@pytest.mark.parametrize("n", range(1, 13))
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n, relabel):
    rounds = round_robin_rounds(n, relabel=relabel)
    assert len(rounds) == (0 if n == 1 else n - 1 if n % 2 == 0 else n)
    seen = [tuple(sorted(pair)) for pairs in rounds for pair in pairs]
    assert sorted(seen) == list(itertools.combinations(range(n), 2))  # each pair exactly once
    for pairs in rounds:
        ranks = [r for pair in pairs for r in pair]
        assert len(ranks) == len(set(ranks))  # disjoint: nobody measures twice at once
        assert len(pairs) == n // 2  # everyone busy but the bye


@pytest.mark.parametrize("n", [6, 8, 9, 16])
def test_later_passes_meet_the_pairs_in_other_company(n):
    """The passes after the first relabel the circle: most pairs share their round with
    other pairs than in the first pass (what a busy round does to a pair is not repeated),
    and every rank draws the same rounds."""
    def company(rounds):
        rounds = [{tuple(sorted(p)) for p in pairs} for pairs in rounds]
        return {pair: frozenset(pairs) - {pair} for pairs in rounds for pair in pairs}

    first = company(round_robin_rounds(n))
    for k in (1, 2):
        again = company(round_robin_rounds(n, relabel=k))
        assert round_robin_rounds(n, relabel=k) == round_robin_rounds(n, relabel=k)
        assert sum(first[p] != again[p] for p in first) >= len(first) // 2


@pytest.mark.parametrize("n", [4, 5, 8, 9, 16])
def test_later_passes_send_both_ways_across_the_ranks_at_once(n):
    """The first pass streams every pair from its lower rank first; a relabelled pass orients
    each pair by its seed, the same on every rank, so some rounds carry flows up and down the
    ranks at once, and over two passes both orientations of most pairs come first somewhere."""
    assert all(a < b for pairs in round_robin_rounds(n) for a, b in pairs)
    later = [pair for k in (1, 2) for pairs in round_robin_rounds(n, relabel=k) for pair in pairs]
    assert round_robin_rounds(n, relabel=1) == round_robin_rounds(n, relabel=1)
    assert any(a > b for a, b in later) and any(a < b for a, b in later)
    mixed = [pairs for k in (1, 2) for pairs in round_robin_rounds(n, relabel=k)
             if len({a < b for a, b in pairs}) == 2]
    assert len(mixed) >= (n - 1) // 2


def test_a_blast_gives_every_rank_a_flow_and_no_more_than_the_larger_side_has():
    racks = [0, 0, 0, 0, 0, 1, 1, 1]
    flows = blast_flows(racks, 0)
    assert len(flows) == 5 and len(set(flows)) == 5
    assert {a for a, _ in flows} == {0, 1, 2, 3, 4} and {b for _, b in flows} == {5, 6, 7}
    assert {a for a, _ in blast_flows(racks, 1)} == {5, 6, 7} and len(blast_flows(racks, 1)) == 5
    assert blast_flows([0, 0, 0], 0) == []


def test_quiet_ranks_neither_send_nor_receive_in_a_blast():
    racks = [0, 0, 1, 2, 2, 3]  # rank 2 and 5: unplaced pingers, 4 the rank they ping
    flows = blast_flows(racks, 0, quiet=[2, 5, 4])
    assert sorted(flows) == [(0, 3), (1, 3)]
    assert blast_flows([0, 1, 1], 0, quiet=[2]) == [(0, 1)]


@pytest.mark.dist
def test_probe_four_loopback_ranks(tmp_path):
    out, png = tmp_path / "topology.json", tmp_path / "topology.png"
    proc = dssync("probe", "--nproc", 4, "--out", out, "--plot", png, *SMALL)
    assert proc.returncode == 0, proc.stderr
    assert "4 ranks, 1 racks [4]" in proc.stdout, proc.stdout
    topo = Topology.load(out)
    assert topo.world_size == 4 and topo.racks() == [[0, 1, 2, 3]]
    for matrix in (topo.latency_us, topo.bandwidth_gbps):
        assert matrix.shape == (4, 4)
        assert np.all(np.diag(matrix) == 0)
        assert np.all(matrix[~np.eye(4, dtype=bool)] > 0)  # both directions of every pair measured
    probe = topo.probe
    assert probe["backend"] == "builtin" and probe["rounds"] == 3
    assert probe["message_bytes"] == 65536 and probe["seconds"] > 0
    # One host: loopback says nothing about NICs or uplinks, so nothing may be flagged.
    assert topo.contention["uplinks"] == [] and topo.contention["nics"] == []
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.dist
def test_probe_odd_world_with_known_racks_runs_the_uplink_phase(tmp_path):
    out = tmp_path / "topology.json"
    proc = dssync("probe", "--nproc", 3, "--rack-sizes", "1,2", "--out", out, *SMALL)
    assert proc.returncode == 0, proc.stderr
    topo = Topology.load(out)
    assert topo.racks() == [[0], [1, 2]] and topo.probe["rounds"] == 3  # odd: a bye each round
    phases = topo.contention["uplink_aggregates"]
    assert [p["rack"] for p in phases] == [0, 1] and [p["flows"] for p in phases] == [2, 2]
    assert all(p["egress_gbps"] > 0 for p in phases)


@pytest.mark.dist
@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 is not installed (apt-get install iperf3)")
def test_probe_iperf3_backend(tmp_path):
    out = tmp_path / "topology.json"
    proc = dssync("probe", "--backend", "iperf3", "--nproc", 2, "--out", out, *SMALL)
    assert proc.returncode == 0, proc.stderr
    topo = Topology.load(out)
    assert topo.probe["backend"] == "iperf3" and topo.probe["rounds"] == 1
    assert topo.bandwidth_gbps[0, 1] > 0 and topo.bandwidth_gbps[1, 0] > 0
    assert topo.latency_us[0, 1] > 0 and topo.latency_us[1, 0] > 0


def test_probe_rejects_rack_sizes_that_do_not_add_up(tmp_path):
    proc = dssync("probe", "--nproc", 4, "--rack-sizes", "2,3", "--out", tmp_path / "t.json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "--rack-sizes 2,3 holds 5 ranks but the world has 4" in proc.stderr


def silent_peer(comm):
    """Rank 0 waits for a ping that rank 1 never sends."""
    import torch

    from dssync.probing.measure import Link

    if comm.rank == 1:
        time.sleep(4)
        return None
    Link(comm).recv([torch.zeros(8, dtype=torch.uint8)], [1], "latency ping")
    return None


@pytest.mark.dist
def test_a_silent_peer_times_out_naming_rank_and_peer():
    t0 = time.monotonic()
    with pytest.raises(DssyncError, match=r"rank 0: probe latency ping with peer 1 failed/timed out"):
        run_ranks(silent_peer, nproc=2, timeout_s=2)
    assert time.monotonic() - t0 < 30  # the job's 2 s timeout bounds the probe's waits too

