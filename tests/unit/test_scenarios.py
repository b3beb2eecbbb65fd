"""The emulated scenarios: every flow names a rack or worker of its layout, and each
scenario's ground truth (which uplinks and NICs its background flows contend)."""

import pytest

from dssync.launch.emulate import SCENARIOS, scenario_contention

# Hand-written from each scenario's description, not from the flows.
TRUTH = {
    "static": ([], []),
    "inter-rack": ([0], []),  # another job across rack 0's uplink
    "inter-rack+nic": ([0], [4]),  # another job from worker 4, through its NIC and rack 0's uplink
    "three-rack": ([0], []),
    "four-rack": ([2], [9]),  # across rack 2's uplink; inside rack 3, through worker 9's NIC
    "inter-rack+slow-nic": ([0], [4]),  # another job across rack 0's uplink; worker 4's NIC at a quarter
    "slow-uplink+slow-nic": ([0], [4]),  # rack 0's uplink at half; worker 4's NIC at a quarter
}


def test_every_scenario_has_its_truth_written_down():
    assert set(SCENARIOS) == set(TRUTH)


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_a_scenarios_flows_contend_what_it_says(name):
    spec = SCENARIOS[name]
    world = sum(spec["rack_sizes"])
    for kind, index in spec["flows"]:
        assert kind in ("rack", "rank", "nic", "cpu")
        assert 0 <= index < (len(spec["rack_sizes"]) if kind == "rack" else world), (kind, index)
    assert scenario_contention(spec) == TRUTH[name]


def test_a_busy_cpu_contends_no_link_and_a_rank_flow_names_its_own_rack():
    spec = {"rack_sizes": [2, 3, 1], "flows": [("cpu", 0), ("rank", 2), ("rank", 5), ("nic", 1)]}
    assert scenario_contention(spec) == ([1, 2], [1, 2, 5])
