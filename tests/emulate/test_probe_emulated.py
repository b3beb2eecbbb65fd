"""``dssync emulate run -- dssync probe`` on real emulated networks: the racks that were built
and exactly the uplinks and NICs that carry background traffic must come out of the probe."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dssync.launch import emulate

pytestmark = pytest.mark.emulate

DSSYNC = str(Path(sys.executable).with_name("dssync"))

# (layout, flows of 8 streams, NIC flows of 2 streams, racks, slow uplinks, slow NICs)
CASES = {
    "static": ("static", [], [], [4, 4], [], []),
    "inter-rack": ("inter-rack", [], [], [4, 4], [0], []),
    "inter-rack+nic": ("inter-rack+nic", [], [], [5, 3], [0], [4]),
    "3,2,4": ([3, 2, 4], [("rack", 2)], [("nic", 1)], [3, 2, 4], [2], [1]),
    "2,3,3": ([2, 3, 3], [("rack", 0)], [("nic", 5)], [2, 3, 3], [0], [5]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_probe_finds_the_racks_and_exactly_the_contended_links(case, name, tmp_path):
    layout, flows, nic_flows, racks, slow_uplinks, slow_nics = CASES[case]
    if isinstance(layout, str):
        spec = emulate.SCENARIOS[layout]
        sizes, flows = spec["rack_sizes"], [*spec["flows"], *flows]
        rates = {"nic": spec["nic"], "uplink": spec["uplink"]}
    else:
        sizes, rates = layout, {}
    out = tmp_path / "topology.json"
    with emulate.cluster(sizes, name=name, **rates):
        if flows:
            emulate.contend(name=name, flows=flows)
        if nic_flows:
            emulate.contend(name=name, flows=nic_flows, streams=2)
        proc = subprocess.run([DSSYNC, "emulate", "run", "--name", name, "--timeout", "180", "--",
                               DSSYNC, "probe", "--out", str(out)],
                              capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    topo = json.loads(out.read_text())
    found = [w["rack"] for w in topo["workers"]]
    # On a miss, the whole measurement: it goes into tests/unit/data/emulated_probes.json.
    assert found == [r for r, size in enumerate(racks) for _ in range(size)], out.read_text()
    assert [u["rack"] for u in topo["contention"]["uplinks"]] == slow_uplinks, out.read_text()
    assert [n["rank"] for n in topo["contention"]["nics"]] == slow_nics, topo["contention"]
    assert topo["probe"]["rounds"] == (sum(sizes) - 1 if sum(sizes) % 2 == 0 else sum(sizes))
