"""``dssync probe --racks-from`` on loopback ranks: the prior travels to every rank and the
topology records it beside what was measured (disagreement: ``tests/emulate``)."""

import subprocess
import sys

import pytest

from dssync.topology import Topology

SMALL = ("--message-mb", "0.0625", "--bandwidth-seconds", "0.05", "--latency-reps", "5", "--timeout", "60")


@pytest.mark.dist
def test_probe_records_a_prior_that_agrees_with_the_measurement(tmp_path):
    out = tmp_path / "topology.json"
    proc = subprocess.run([sys.executable, "-m", "dssync.cli", "probe", "--nproc", "2", "--out", str(out),
                           "--racks-from", "hostnames:(.*)", *SMALL], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    topo = Topology.load(out)
    assert topo.racks() == [[0, 1]]  # one host: one rack, measured and named alike
    assert topo.confidence["racks_from"] == {"source": "hostnames:(.*)", "prior": [0, 0], "measured": [0, 0],
                                             "prior_decides": []}
    assert topo.confidence["prior_disagrees"] == []
    assert "--racks-from" not in proc.stderr  # nothing to say
