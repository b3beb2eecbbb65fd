"""Transient straggler episodes: their syntax, their checks and their schedule (no namespaces)."""

import pytest

from dssync.launch import emulate
from dssync.launch.emulate import Episode, parse_episode


@pytest.mark.parametrize(("text", "episode"), [
    ("1:cpu=0.1@5+20", Episode(1, 5.0, 20.0, cpu=0.1)),
    (" 0:cpu=2@0+1.5 ", Episode(0, 0.0, 1.5, cpu=2.0)),
    ("3:nic=100mbit@0+30", Episode(3, 0.0, 30.0, nic="100mbit")),
    ("2:delay=30ms@10+60", Episode(2, 10.0, 60.0, delay="30ms")),
    ("4:nic=300M@.5s+2s", Episode(4, 0.5, 2.0, nic="300M")),
])
def test_parse_episode(text, episode):
    assert parse_episode(text) == episode
    assert parse_episode(str(episode)) == episode  # str() is what run_dssync passes on


@pytest.mark.parametrize("text", ["", "1:cpu=0.1", "1:cpu=0.1@5", "cpu=0.1@5+20", "x:cpu=0.1@5+20",
                                  "1:mem=1g@0+1", "1:cpu=0.1@-1+2", "1 : cpu=0.1@5+20", "1:cpu=0.1@5-20"])
def test_bad_episode_syntax_names_the_form_and_an_example(text):
    with pytest.raises(ValueError, match=r"RANK:KIND=VALUE@START\+DURATION.*e\.g\. 1:cpu=0\.1@5\+20"):
        parse_episode(text)


@pytest.mark.parametrize(("text", "match"), [
    ("1:cpu=0@0+1", "positive number of cores"),
    ("1:cpu=inf@0+1", "positive number of cores"),
    ("1:cpu=fast@0+1", "not a number of cores"),
    ("1:cpu=0.5@0+0", "lasts more than 0 s"),
    ("1:nic=fast@0+1", "cannot read rate"),
    ("1:nic=1kbit@0+1", "below 8 kbit/s"),
    ("1:delay=30@0+1", "cannot read delay"),
    ("1:delay=soon@0+1", "cannot read delay"),
])
def test_bad_episode_values(text, match):
    with pytest.raises(ValueError, match=match):
        parse_episode(text)


def test_an_episode_changes_exactly_one_thing():
    with pytest.raises(ValueError, match="exactly one"):
        Episode(1, 0.0, 1.0)
    with pytest.raises(ValueError, match="exactly one"):
        Episode(1, 0.0, 1.0, cpu=0.5, nic="1gbit")
    e = Episode(1, 5.0, 20.0, cpu=0.1)
    assert (e.kind, e.value, e.end_s) == ("cpu", 0.1, 25.0)


def test_episode_ranks_are_checked_against_the_cluster():
    c = emulate.Cluster(name="x", rack_sizes=[2, 1], nic_bps=10**9, uplink_bps=10**9)
    emulate.check_episodes(c, [Episode(2, 0.0, 1.0, cpu=0.5)])
    with pytest.raises(ValueError, match=r"has workers 0\.\.2"):
        emulate.check_episodes(c, [Episode(3, 0.0, 1.0, cpu=0.5)])


def test_delay_episodes_are_refused_up_front_without_netem(monkeypatch):
    c = emulate.Cluster(name="x", rack_sizes=[2], nic_bps=10**9, uplink_bps=10**9)

    def no_netem():
        raise emulate.EmulationError("delay episodes need the netem qdisc, the kernel module sch_netem")

    monkeypatch.setattr(emulate.episodes, "check_netem", no_netem)  # looked up there
    emulate.check_episodes(c, [Episode(1, 0.0, 1.0, nic="100mbit")])  # no delay: netem is not needed
    with pytest.raises(emulate.EmulationError, match="sch_netem"):
        emulate.check_episodes(c, [Episode(1, 0.0, 1.0, delay="30ms")])


def test_episodes_apply_in_order_and_stop_undoes_what_is_still_on(monkeypatch):
    """The schedule against recorded calls: overlapping episodes, static limits restored."""
    c = emulate.Cluster(name="x", rack_sizes=[2], nic_bps=10**9, uplink_bps=10**9, cpu_limit={1: 0.5},
                        nic_override={0: 5 * 10**8})
    calls, lines = [], []
    monkeypatch.setattr(emulate.episodes, "load_state", lambda name: c)
    monkeypatch.setattr(emulate.episodes, "set_cpu_quota", lambda c, rank, cores: calls.append(("cpu", rank, cores)))
    monkeypatch.setattr(emulate.episodes, "shape_nic", lambda c, rank, bps=None: calls.append(("nic", rank, bps)))
    monkeypatch.setattr(emulate.episodes, "delay_nic", lambda c, rank, bps, delay: calls.append(("delay", rank, delay)))
    stragglers = emulate.Episodes(c, [Episode(1, 1.0, 2.0, cpu=0.1), Episode(1, 2.0, 5.0, cpu=0.2),
                                       Episode(0, 0.0, 1.0, nic="100mbit"), Episode(0, 0.5, 10.0, delay="5ms")],
                                   lines.append)
    stragglers.prepare()
    assert calls == [("cpu", 1, 0.5)]  # worker 1's cgroup, at its static limit until its episode
    calls.clear()
    stragglers.advance(0.0)
    stragglers.advance(1.0)
    stragglers.advance(3.0)
    assert calls == [("nic", 0, 10**8),  # 0 s
                     ("nic", 0, 10**8), ("delay", 0, "5ms"),  # 0.5 s
                     ("nic", 0, 5 * 10**8), ("delay", 0, "5ms"),  # 1 s: back to the static rate, delay kept
                     ("cpu", 1, 0.1),  # 1 s
                     ("cpu", 1, 0.2),  # 2 s: the later episode wins
                     ("cpu", 1, 0.2)]  # 3 s: the first one ends, the second is still on
    calls.clear()
    stragglers.stop()
    assert sorted(calls, key=str) == sorted([("cpu", 1, 0.5), ("nic", 0, 5 * 10**8), ("delay", 0, None)], key=str)
    assert lines[0] == "[episode] worker 0: nic 100mbit (at 0.0 s, for 1 s)\n"
    assert "[episode] worker 1: cpu 0.1 cores (at 1.0 s, for 2 s)\n" in lines
    assert "[episode] worker 0: nic restored to 500 Mbit/s (at 1.0 s)\n" in lines
    assert any(line.startswith("[episode] worker 1: cpu restored to 0.5 cores (at ") for line in lines)
    assert any(line.startswith("[episode] worker 0: delay restored (at ") for line in lines)
    stragglers.stop()  # a second stop changes nothing
    assert len(calls) == 3
