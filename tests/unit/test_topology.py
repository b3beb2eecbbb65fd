import json

import numpy as np
import pytest

from dssync.errors import TopologyError
from dssync.topology import Topology, Worker


def test_roundtrip(tmp_path):
    n = 4
    lat = np.full((n, n), 50.0) - 50.0 * np.eye(n)
    bw = np.full((n, n), 0.9) - 0.9 * np.eye(n)
    topo = Topology(
        workers=tuple(Worker(rank=r, host=f"h{r}", rack=r // 2) for r in range(n)),
        latency_us=lat, bandwidth_gbps=bw,
        contention={"uplinks": [{"rack": 0, "bandwidth_gbps": 0.31}], "nics": []},
        probe={"backend": "builtin", "seconds": 1.0, "message_bytes": 1024},
    )
    path = tmp_path / "t.json"
    topo.save(path)
    back = Topology.load(path)
    assert back.to_dict() == topo.to_dict()
    assert back.racks() == [[0, 1], [2, 3]]
    np.testing.assert_allclose(back.bandwidth_gbps, bw)


def test_hand_written_needs_only_workers(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"version": 1, "workers": [
        {"rank": 1, "rack": 0}, {"rank": 0, "rack": 0}, {"rank": 2, "rack": 1}]}))
    topo = Topology.load(path)
    assert topo.world_size == 3 and topo.racks() == [[0, 1], [2]]
    assert topo.latency_us is None


def test_even_and_rack_sizes():
    assert Topology.even(8, 2).racks() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert Topology.even(7, 3).racks() == [[0, 1, 2], [3, 4], [5, 6]]
    assert Topology.from_rack_sizes([1, 3]).racks() == [[0], [1, 2, 3]]


@pytest.mark.parametrize(("doc", "match"), [
    ({"version": 2, "workers": []}, "version"),
    ({"version": 1, "workers": "x"}, "workers"),
    ({"version": 1, "workers": []}, "no workers"),
    ({"version": 1, "workers": [{"rank": 0, "rack": 0}, {"rank": 0, "rack": 0}]}, r"duplicated ranks \[0\]"),
    ({"version": 1, "workers": [{"rank": 0, "rack": 0}, {"rank": 2, "rack": 0}]}, r"missing ranks \[1\]"),
    ({"version": 1, "workers": [{"rank": 0, "rack": 1}, {"rank": 1, "rack": 0}]}, "renumber"),
    ({"version": 1, "workers": [{"rank": 0}]}, '"rank" and "rack"'),
    ({"version": 1, "world_size": 3, "workers": [{"rank": 0, "rack": 0}]}, "world_size"),
    ({"version": 1, "workers": [{"rank": 0, "rack": 0}, {"rank": 1, "rack": 0}],
      "latency_us": [[0, 1, 2]]}, "2x2"),
    ({"version": 1, "workers": [{"rank": 0, "rack": 0}, {"rank": 1, "rack": 0}],
      "bandwidth_gbps": [[0, -1], [1, 0]]}, "non-negative"),
])
def test_malformed_is_rejected_with_reason(tmp_path, doc, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TopologyError, match=match):
        Topology.load(path)


def test_not_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(TopologyError, match="not valid JSON"):
        Topology.load(path)
    with pytest.raises(TopologyError, match="does not exist"):
        Topology.load(tmp_path / "absent.json")


def test_a_duplicate_rank_among_100000_is_named_with_the_first_few_of_each_kind():
    workers = [{"rank": i, "rack": i // 100} for i in range(100_000)]
    workers[5]["rank"] = 6
    with pytest.raises(TopologyError, match=r"missing ranks \[5\], duplicated ranks \[6\]$"):
        Topology.from_dict({"version": 1, "workers": workers})
    workers = [{"rank": i, "rack": 0} for i in range(100_000)]
    workers.pop(0)
    workers.append({"rank": 100_000, "rack": 0})
    with pytest.raises(TopologyError, match=r"ranks out of range \[100000\]"):
        Topology.from_dict({"version": 1, "workers": workers})
