"""The event-driven flow model (bench.flows) against closed forms worked out by hand, and its
rate allocation against the defining property of weighted max-min fairness."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dssync.bench import flows
from dssync.bench.links import Network
from dssync.patterns import Op, Pattern

B = 125e6
S = 1e6


def _every_iteration(*ops: Op) -> Pattern:
    return Pattern((), (tuple(ops),))


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_a_ring_on_clear_links_moves_two_n_minus_one_over_n_of_the_model_through_each_nic(n):
    net = Network((n,), nic_bps=B, uplink_bps=B, alpha_s=0.0)
    ms = flows.rank_times(net, _every_iteration(Op("allreduce", (tuple(range(n)),), S)), 3)
    # every connection of the ring stays busy: 2(n-1) chunks of S/n at the NIC's rate
    assert ms == pytest.approx(np.full((3, n), 2 * (n - 1) * S / n / B))


def test_a_pair_through_an_uplink_another_job_loads_gets_its_weighted_share_after_the_queue():
    k, w, queue = 8, 0.25, 0.02
    net = Network((1, 1), nic_bps=B, uplink_bps=B, alpha_s=0.0, uplink_out_streams={0: k},
                  background_weight=w, queue_s=queue)
    ms = flows.rank_times(net, _every_iteration(Op("allreduce", ((0, 1),), S)), 2)
    # 0 -> 1 shares rack 0's uplink with k streams of weight w, 1 -> 0 is clear. A message moves
    # once its receiver's notice is back (the notice from rank 1 comes over the clear side, the
    # one from rank 0 waits the queue), and what crosses the loaded side waits the queue
    slow, half = B / (1 + w * k), S / 2
    first_to_1 = queue + half / slow
    first_to_0 = queue + half / B  # rank 0's notice waited the queue
    # rank 0 sends its reduced half once it has rank 1's; it moves once rank 1 has the first
    assert ms[0, 1] == pytest.approx(max(first_to_0, first_to_1) + queue + half / slow, rel=1e-6)
    # rank 1 sends its reduced half once it has rank 0's first; rank 0's notice for it left
    # when rank 0 had rank 1's first half
    assert ms[0, 0] == pytest.approx(max(first_to_1, first_to_0 + queue) + half / B, rel=1e-6)


def test_a_member_that_leaves_with_bytes_in_flight_goes_on_while_they_are_still_queued():
    # rank 0 averages with rank 2 in the other rack, whose uplink out of rack 0 another job
    # loads to a quarter for the job, then with its rack-mate 1: it leaves the first pair once
    # rank 2's reduced half is back over the clear side, while its own second half to rank 2
    # still crosses the loaded uplink, and starts the second pair at once
    net = Network((2, 1), nic_bps=B, uplink_bps=B, alpha_s=0.0, uplink_out_streams={0: 3})
    ms = flows.rank_times(net, Pattern((), ((Op("allreduce", ((0, 2),), S), Op("allreduce", ((0, 1),), S)),)), 1)
    slow, half = B / 4, S / 2
    assert ms[0, 2] == pytest.approx(S / slow)  # both halves to rank 2 at the loaded uplink's rate
    leaves_first = half / slow + half / B
    assert leaves_first < S / slow
    # the second pair takes at least its time alone after that, and ends before the first
    # pair's last bytes plus that time: it overlapped them
    assert leaves_first + S / B <= ms[0, 0] + 1e-12
    assert ms[0, 0] < S / slow + S / B
    # rank 1, there from the start, ends after rank 0: what 0 sends it shared 0's NIC with the tail
    assert ms[0, 1] > ms[0, 0]


def test_a_pattern_where_a_rank_waits_for_a_message_nobody_sends_is_a_named_error():
    net = Network((2,), nic_bps=B, uplink_bps=B, alpha_s=0.0)
    with pytest.raises(RuntimeError, match=r"ranks \[1\] wait"):
        flows.rank_times(net, _every_iteration(Op("send", ((0, 1), (2, 1)), S)), 1)


def test_the_parameter_servers_push_pull_is_a_push_to_every_shard_and_its_reply():
    n = 4
    net = Network((n,), nic_bps=B, uplink_bps=B, alpha_s=0.0)
    ms = flows.rank_times(net, _every_iteration(Op("push-pull", tuple((i,) for i in range(n)), S)), 1)
    # every NIC carries n-1 pushes out (and n-1 replies out): 2 (n-1) S/n at the NIC's rate
    assert ms[0] == pytest.approx(np.full(n, 2 * (n - 1) * S / n / B))


def test_a_synchronous_round_on_the_servers_waits_for_every_members_push():
    # rank 1 is held up receiving 4S from rank 0 before it pushes. In a synchronous round (BSP
    # on the servers, the world one group) no shard replies before rank 1's push is in, so
    # every rank waits at least those 4S, then rank 1's push of S/n and a reply of S/n, each at
    # a NIC's rate at most; in ASP (groups of one) rank 2 waits for nobody
    n = 4
    net = Network((n,), nic_bps=B, uplink_bps=B, alpha_s=0.0)

    def ms(groups):
        pat = _every_iteration(Op("send", ((0, 1),), 4 * S), Op("push-pull", groups, S))
        return flows.rank_times(net, pat, 1)[0]
    held = 4 * S / B
    assert ms(((0, 1, 2, 3),)).min() >= held + 2 * S / n / B - 1e-12
    assert ms(tuple((i,) for i in range(n)))[2] < held


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_rates_are_weighted_max_min_fair(data):
    links = data.draw(st.integers(1, 6))
    caps = np.array(data.draw(st.lists(st.floats(1.0, 100.0), min_size=links, max_size=links)))
    background = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 2.0]), min_size=links, max_size=links)))
    paths = data.draw(st.lists(st.lists(st.integers(0, links - 1), min_size=1, max_size=3, unique=True),
                               min_size=1, max_size=8))
    weights = np.array(data.draw(st.lists(st.sampled_from([1.0, 0.25]), min_size=len(paths), max_size=len(paths))))
    rate = flows.rates(paths, caps, background, weights)
    used = np.zeros(links)
    for p, r in zip(paths, rate, strict=True):
        used[p] += r
    assert (rate > 0).all() and (used <= caps * (1 + 1e-9)).all()
    # the definition: every flow has a bottleneck, a link that is full (the background taking
    # its weight's share at the link's level) and on which no flow's rate per weight is higher
    for k, p in enumerate(paths):
        level = rate[k] / weights[k]
        full = [j for j in p
                if used[j] + background[j] * level == pytest.approx(caps[j], rel=1e-6)
                and all(rate[m] / weights[m] <= level * (1 + 1e-9) for m, q in enumerate(paths) if j in q)]
        assert full, f"flow {k} on {p} at {rate[k]} has no bottleneck"


def test_the_check_refuses_a_queue_measured_at_another_rate_scale(tmp_path):
    record, queue = tmp_path / "simcheck.json", tmp_path / "queue-rtt.json"
    record.write_text('{"rate_scale": 0.05}')
    queue.write_text('{"rate_scale": 0.1, "queue_s": 0.01, "rtt_s": 0.0002}')
    with pytest.raises(SystemExit, match="rate scale 0.1"):
        flows.main(["--record", str(record), "--queue-rtt", str(queue)])
