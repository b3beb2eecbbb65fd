"""``--racks-from``: racks a user knows (host-name patterns, SLURM's topology) as a prior that
the measured racks are checked against (``dssync.topology.prior``)."""

import subprocess

import numpy as np
import pytest

from dssync.errors import TopologyError
from dssync.topology.placement import RackFit
from dssync.topology.prior import (
    RackPrior,
    describe_disagreements,
    disagreements,
    expand_hostlist,
    parse_racks_from,
    parse_slurm_topology,
    resolve_racks,
    slurm_switches,
    weigh_prior,
)
from dssync.topology.racks import fit_racks

# -- hostnames:REGEX ----------------------------------------------------------------------------


def test_the_first_group_names_the_rack_and_racks_are_numbered_by_lowest_rank():
    prior = parse_racks_from(r"hostnames:rack(\d+)-")
    hosts = ["rack7-n1", "rack3-n1", "rack7-n2", "rack3-n2", "rack9-n1"]
    assert prior.racks(hosts) == [0, 1, 0, 1, 2]
    assert prior.source == r"hostnames:rack(\d+)-" and prior.pattern == r"rack(\d+)-"


def test_without_a_group_the_whole_match_names_the_rack():
    assert parse_racks_from(r"hostnames:^[a-z]+").racks(["ab1", "cd1", "ab2"]) == [0, 1, 0]


def test_the_first_group_that_took_part_names_the_rack():
    prior = parse_racks_from(r"hostnames:^(?:left-(\d)|right-(\d))")
    assert prior.racks(["left-1", "right-2", "left-1x", "right-3"]) == [0, 1, 0, 2]


def test_a_host_the_pattern_does_not_match_is_an_error_naming_the_rank_and_the_host():
    prior = parse_racks_from(r"hostnames:^rack(\d)")
    with pytest.raises(TopologyError, match=r"rank 2's host 'login7' does not match"):
        prior.racks(["rack1a", "rack2a", "login7"])


@pytest.mark.parametrize("text, needle", [
    ("hostnames:", "needs a pattern"),
    ("hostnames:rack(", "is no regular expression"),
    ("hosts:rack", "takes slurm or hostnames:REGEX"),
    ("SLURM", "takes slurm or hostnames:REGEX"),
])
def test_bad_racks_from_is_an_error_saying_what_to_give(text, needle):
    with pytest.raises(TopologyError, match=needle):
        parse_racks_from(text)


# -- SLURM ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, hosts", [
    ("tux1", ["tux1"]),
    ("tux[1-3]", ["tux1", "tux2", "tux3"]),
    ("tux[01-03,7]", ["tux01", "tux02", "tux03", "tux7"]),
    ("tux[8-10]", ["tux8", "tux9", "tux10"]),
    ("tux[098-101]", ["tux098", "tux099", "tux100", "tux101"]),
    ("tux[1-2],db,web[5]", ["tux1", "tux2", "db", "web5"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
    (" a , b ", ["a", "b"]),
])
def test_hostlists_expand_as_slurm_expands_them(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["tux[1-3", "tux1-3]", "tux[[1-2]]", "tux[a-c]", "tux[5-3]"])
def test_hostlists_the_expander_does_not_know_are_refused(text):
    with pytest.raises(ValueError):
        expand_hostlist(text)


TREE = """\
SwitchName=s0 Level=0 LinkSpeed=1 Nodes=node[01-04]
SwitchName=s1 Level=0 LinkSpeed=1 Nodes=node[05-06],gpu1
SwitchName=s2 Level=0 LinkSpeed=1 Nodes=(null)
SwitchName=top Level=1 LinkSpeed=1 Switches=s[0-2] Nodes=node[01-06],gpu1
"""


def test_slurm_tree_topology_maps_every_node_to_its_leaf_switch():
    assert parse_slurm_topology(TREE) == {**{f"node0{i}": "s0" for i in range(1, 5)},
                                          "node05": "s1", "node06": "s1", "gpu1": "s1"}


def test_slurm_switch_lines_without_a_level_are_leaves_when_they_list_no_switches():
    text = "SwitchName=a Nodes=x[1-2]\nSwitchName=b Nodes=y1\nSwitchName=c Switches=a,b Nodes=x[1-2],y1\n"
    assert parse_slurm_topology(text) == {"x1": "a", "x2": "a", "y1": "b"}


def test_slurm_block_topology_maps_every_node_to_its_block():
    text = ("BlockName=b1 BlockIndex=0 Nodes=n[1-2] BlockSize=2\n"
            "BlockName=b2 BlockIndex=1 Nodes=n[3-4] BlockSize=2\n"
            "AggregatedBlock=b[1-2] BlockIndex=2 Nodes=n[1-4] BlockSize=4\n")
    assert parse_slurm_topology(text) == {"n1": "b1", "n2": "b1", "n3": "b2", "n4": "b2"}


def test_a_node_under_two_leaf_switches_is_an_error():
    with pytest.raises(TopologyError, match="node n2 under two leaf switches, a and b"):
        parse_slurm_topology("SwitchName=a Level=0 Nodes=n[1-2]\nSwitchName=b Level=0 Nodes=n[2-3]\n")


def test_slurm_hosts_match_by_full_or_short_name():
    prior = RackPrior(source="slurm", switches=parse_slurm_topology(TREE))
    assert prior.racks(["node05.cluster", "node01", "gpu1.ib.cluster", "node02"]) == [0, 1, 0, 1]
    with pytest.raises(TopologyError, match=r"rank 1's host 'login1' is under no leaf switch"):
        prior.racks(["node01", "login1"])


class FakeScontrol:
    """``subprocess.run`` as far as ``slurm_switches`` uses it: what each ``scontrol show``
    prints, and every call made."""

    def __init__(self, topology="", returncode=0, stderr="", hostnames=None):
        self.topology, self.returncode, self.stderr = topology, returncode, stderr
        self.hostnames = hostnames or {}
        self.calls = []

    def __call__(self, argv, **kwargs):
        self.calls.append(argv[1:])
        out = self.topology if argv[2] == "topology" else "\n".join(self.hostnames[argv[3]]) + "\n"
        return subprocess.CompletedProcess(argv, self.returncode, out, self.stderr)


def found(path):
    return lambda name: path


def test_racks_from_slurm_asks_scontrol_once():
    run = FakeScontrol(TREE)
    prior = parse_racks_from("slurm", run=run, which=found("/usr/bin/scontrol"))
    assert prior.racks(["node06", "node01"]) == [0, 1]
    assert run.calls == [["show", "topology"]]


def test_a_node_list_the_expander_does_not_know_goes_to_scontrol_show_hostnames():
    run = FakeScontrol("SwitchName=s0 Level=0 Nodes=odd[1-2\n", hostnames={"odd[1-2": ["odd1", "odd2"]})
    assert slurm_switches(run=run, which=found("/bin/scontrol")) == {"odd1": "s0", "odd2": "s0"}
    assert run.calls == [["show", "topology"], ["show", "hostnames", "odd[1-2"]]


def test_racks_from_slurm_without_scontrol_says_so():
    with pytest.raises(TopologyError, match="needs scontrol, SLURM's client, on the PATH"):
        parse_racks_from("slurm", run=FakeScontrol(TREE), which=found(None))


def test_racks_from_slurm_without_a_topology_says_so():
    run = FakeScontrol("No topology information available\n")
    with pytest.raises(TopologyError, match="SLURM reports no topology"):
        parse_racks_from("slurm", run=run, which=found("/bin/scontrol"))


def test_racks_from_slurm_says_why_scontrol_failed():
    run = FakeScontrol(returncode=1, stderr="slurm_load_topo error: Unable to contact slurm controller\n")
    with pytest.raises(TopologyError, match=r"exit 1\): slurm_load_topo error: Unable to contact"):
        parse_racks_from("slurm", run=run, which=found("/bin/scontrol"))


# -- the prior against the measurement ----------------------------------------------------------


def matrices(racks, *, intra_gbps=1.0, inter_gbps=0.25, intra_us=30.0, inter_us=200.0):
    same = np.equal.outer(racks, racks)
    lat = np.where(same, intra_us, inter_us).astype(float)
    bw = np.where(same, intra_gbps, inter_gbps).astype(float)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, 0.0)
    return lat, bw


SOURCE = r"hostnames:^node-(\d)-"


def test_disagreements_name_what_each_side_puts_together():
    assert disagreements([0, 0, 1, 1], [0, 0, 1, 1]) == []
    assert disagreements([0, 0, 1, 1], [1, 1, 0, 0]) == []  # the same racks, numbered otherwise
    assert disagreements([0, 0, 1, 1], [0, 1, 0, 1]) == [
        {"ranks": [0], "measured_with": [1], "prior_with": [2]},
        {"ranks": [1], "measured_with": [0], "prior_with": [3]},
        {"ranks": [2], "measured_with": [3], "prior_with": [0]},
        {"ranks": [3], "measured_with": [2], "prior_with": [1]},
    ]
    assert disagreements([0, 0, 0, 0], [0, 0, 1, 1]) == [
        {"ranks": [0, 1], "measured_with": [2, 3], "prior_with": []},
        {"ranks": [2, 3], "measured_with": [0, 1], "prior_with": []},
    ]


def test_disagreements_are_said_once_each_in_words():
    merged = describe_disagreements("hostnames:x", disagreements([0, 0, 0, 0], [0, 0, 1, 1]))
    assert merged == ["--racks-from hostnames:x: ranks 0-1 measure as one rack with ranks 2-3, not their own"]
    split = describe_disagreements("slurm", disagreements([0, 0, 1, 2, 2], [0, 0, 0, 1, 1]))
    assert split == ["--racks-from slurm: ranks 0-1 measure as a rack of their own, not with rank 2"]
    swapped = describe_disagreements("s", disagreements([0, 0, 1, 1], [0, 1, 0, 1]))
    assert swapped == ["--racks-from s: rank 0 measures as one rack with rank 1, not with rank 2",
                       "--racks-from s: rank 1 measures as one rack with rank 0, not with rank 3",
                       "--racks-from s: rank 2 measures as one rack with rank 3, not with rank 0"]


def test_a_confident_measurement_that_disagrees_keeps_its_racks_and_says_where(capsys):
    """Matrices of racks {0,1},{2,3}; host names that say {0,2},{1,3}."""
    fit = fit_racks(*matrices(np.array([0, 0, 1, 1])))
    assert fit.confidence()["confident"]
    prior = parse_racks_from(SOURCE).racks(["node-0-a", "node-1-b", "node-0-c", "node-1-d"])
    assert prior == [0, 1, 0, 1]
    racks, record = weigh_prior(fit, prior, SOURCE, report=True)
    assert racks == [0, 0, 1, 1]
    assert record["racks_from"] == {"source": SOURCE, "prior": [0, 1, 0, 1], "measured": [0, 0, 1, 1],
                                    "prior_decides": []}
    assert record["prior_disagrees"][0] == {"ranks": [0], "measured_with": [1], "prior_with": [2]}
    assert len(record["prior_disagrees"]) == 4
    err = capsys.readouterr().err
    assert f"warning: --racks-from {SOURCE}: rank 0 measures as one rack with rank 1, not with rank 2" in err
    assert "the probe keeps the measured racks" in err


def test_a_measurement_unsure_of_every_rank_takes_the_prior(capsys):
    fit = RackFit(n=4, groups=[[0, 1], [2, 3]], margins={0: 1.1, 1: 1.1, 2: 1.1, 3: 1.1}, metric="bandwidth")
    assert fit.confidence()["unsure"] == [0, 1, 2, 3]
    racks, record = weigh_prior(fit, [0, 1, 0, 1], SOURCE, report=True)
    assert racks == [0, 1, 0, 1]
    assert record["racks_from"]["prior_decides"] == [0, 1, 2, 3] and record["unsure"] == []
    assert len(record["prior_disagrees"]) == 4  # recorded, though the prior won
    assert "the measurement is unsure of ranks 0-3; the probe keeps the prior's racks" in capsys.readouterr().err


def test_an_unsure_rank_follows_the_prior_and_the_sure_ones_the_measurement():
    """Measured {0,1},{2,3} with rank 2 unsure; the prior {0,2},{1,3} puts rank 2 beside
    rank 0, so it joins rank 0's measured rack, while 0 and 1 stay together and 3 alone."""
    assert resolve_racks([0, 0, 1, 1], [0, 1, 0, 1], {2}) == ([0, 0, 0, 1], [2])


def test_a_prior_that_joins_racks_the_measurement_keeps_apart_decides_nothing():
    # rank 2 unsure; the prior puts it beside sure ranks 0 and 3, which measure in two racks
    assert resolve_racks([0, 0, 1, 1], [0, 1, 0, 0], {2}) == ([0, 0, 1, 1], [])


def test_the_prior_places_a_blind_rank_the_measurement_could_not(capsys):
    """Racks 3,3,3 with rank 4's NIC slower than any cross-rack share: the pairs cannot
    place it (unplaced, a rack of its own). The prior, which agrees with the measurement on
    every other rank, puts it in the middle rack; nothing disagrees but the rack of one."""
    racks_built = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    lat, bw = matrices(racks_built, inter_gbps=0.5)
    bw[4, :] = np.minimum(bw[4, :], 0.3)
    bw[:, 4] = np.minimum(bw[:, 4], 0.3)
    lat = np.full((9, 9), 50.0)
    np.fill_diagonal(lat, 0.0)
    fit = fit_racks(lat, bw)
    assert fit.unplaced == [4] and fit.racks() == [0, 0, 0, 1, 2, 1, 3, 3, 3]
    racks, record = weigh_prior(fit, racks_built.tolist(), "slurm", report=True)
    assert racks == racks_built.tolist()
    assert record["unplaced"] == [] and record["racks_from"]["prior_decides"] == [4]
    assert record["prior_disagrees"] == [{"ranks": [3, 5], "measured_with": [], "prior_with": [4]},
                                         {"ranks": [4], "measured_with": [], "prior_with": [3, 5]}]
    err = capsys.readouterr().err
    assert "ranks 3, 5 measure as a rack of their own, not with rank 4" in err
    assert "unsure of rank 4; the probe keeps the prior's racks" in err


def test_one_rack_guessed_where_no_split_was_clean_gives_way_to_the_prior():
    lat = np.full((5, 5), 100.0)
    lat[0, 1] = lat[1, 0] = lat[2, 3] = lat[3, 2] = 300.0
    np.fill_diagonal(lat, 0.0)
    fit = fit_racks(lat)
    assert fit.confidence()["one_rack_guess"]
    racks, record = weigh_prior(fit, [0, 1, 0, 1, 1], SOURCE)
    assert racks == [0, 1, 0, 1, 1] and record["one_rack_guess"] is False and record["unsure"] == []
    from dssync.commands.probe import confidence_lines

    # what the probe would warn of: nothing about a one-rack guess the prior replaced
    assert confidence_lines({**fit.confidence(), **record}) == []


def test_a_prior_that_agrees_changes_nothing_and_says_nothing(capsys):
    fit = fit_racks(*matrices(np.array([0, 0, 1, 1, 1])))
    racks, record = weigh_prior(fit, [3, 3, 1, 1, 1], SOURCE, report=True)
    assert racks == [0, 0, 1, 1, 1] and record["prior_disagrees"] == []
    assert capsys.readouterr().err == ""
