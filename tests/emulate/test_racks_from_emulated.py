"""``dssync probe --racks-from hostnames:REGEX`` on an emulated cluster whose host names say
other racks than the ones built: the measurement keeps its racks and says where the prior is wrong."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dssync.launch import emulate

pytestmark = pytest.mark.emulate

DSSYNC = str(Path(sys.executable).with_name("dssync"))

# Each worker's host name, set before it becomes `dssync probe` (`dssync emulate run` names
# them w0..w3): node-<RANK mod 2>-<RANK>, so the names put ranks 0,2 and 1,3 together.
NAMED = 'export DSSYNC_HOST="node-$((RANK % 2))-$RANK"; exec "$0" "$@"'
SOURCE = r"hostnames:^node-(\d)-"


def test_probe_racks_from_hostnames_that_the_measurement_disagrees_with(name, tmp_path):
    """Racks 0-1 and 2-3 as built, behind 300 Mbit/s uplinks (cross-rack flows at most a
    third of the 1 Gbit/s NICs: the pairs tell the racks apart with room to spare); host
    names that say 0,2 and 1,3. The measurement is sure, so its racks are written, and the
    topology and stderr say where the prior disagrees."""
    out = tmp_path / "topology.json"
    with emulate.cluster([2, 2], nic="1gbit", uplink="300mbit", name=name):
        proc = subprocess.run([DSSYNC, "emulate", "run", "--name", name, "--timeout", "180", "--",
                               "sh", "-c", NAMED, DSSYNC, "probe", "--racks-from", SOURCE, "--out", str(out)],
                              capture_output=True, text=True, timeout=240)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-4000:]
    topo = json.loads(out.read_text())
    conf = topo["confidence"]
    assert [w["host"] for w in topo["workers"]] == ["node-0-0", "node-1-1", "node-0-2", "node-1-3"]
    assert conf["racks_from"]["source"] == SOURCE and conf["racks_from"]["prior"] == [0, 1, 0, 1]
    assert conf["racks_from"]["measured"] == [0, 0, 1, 1], out.read_text()
    # sure of the racks (whether two uplinks slow alike are slow, it need not be)
    assert conf["racks_confident"] and conf["racks_from"]["prior_decides"] == [], out.read_text()
    assert [w["rack"] for w in topo["workers"]] == [0, 0, 1, 1]  # the measurement's, not the prior's
    assert conf["prior_disagrees"] == [
        {"ranks": [0], "measured_with": [1], "prior_with": [2]},
        {"ranks": [1], "measured_with": [0], "prior_with": [3]},
        {"ranks": [2], "measured_with": [3], "prior_with": [0]},
        {"ranks": [3], "measured_with": [2], "prior_with": [1]},
    ]
    assert f"--racks-from {SOURCE}: rank 0 measures as one rack with rank 1, not with rank 2" in said, said[-4000:]
    assert "the probe keeps the measured racks" in said
