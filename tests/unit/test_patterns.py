"""The patterns the simulator prices are the calls the strategies make.

Each strategy that runs on the communicator runs a few iterations on the in-process fake
world, which records every call (rank, collective, group, elements); each rank's calls per
iteration must be what its strategy's pattern says, op by op, in order. ddp and torch-hier
communicate through torch.distributed and asp and sync-switch through the parameter
servers' own sockets, outside the fake world: for them the settings that shape their
pattern are checked against their Configs.
"""

import subprocess
import sys

import pytest
import torch
from torch import nn

from dssync.collectives import FakeWorld
from dssync.patterns import DEFAULTS, MODELLED, Op, pattern, read_spec
from dssync.planning.planner import plan
from dssync.strategies import REGISTRY, get_strategy, simulated
from dssync.strategies.base import StrategyContext
from dssync.topology import Topology

NUMEL = 3 * 2 + 2  # nn.Linear(3, 2): every strategy here exchanges one flat buffer of its 8 parameters


def _expected(op: Op, rank: int) -> list[tuple[str, tuple[int, ...], int]]:
    """The call ``rank`` makes for ``op`` on the fake world, if any (a group of one makes none)."""
    if op.kind == "send":
        return [(f"send{dst}", (src, dst), int(op.nbytes)) for src, dst in op.groups if src == rank]
    group = next((g for g in op.groups if rank in g), None)
    if group is None or len(group) == 1:
        return []
    name = {"allreduce": "allreduce", "reduce": f"reduce{group[0]}", "broadcast": f"broadcast{group[0]}"}[op.kind]
    return [(name, tuple(group), int(op.nbytes))]


def _calls_by_iteration(spec: str, rack_sizes: list[int], steps: int) -> list[list[list[tuple]]]:
    """Per rank, per iteration: the calls the strategy made (setup's left out)."""
    name, settings = read_spec(spec)
    cls = get_strategy(name)
    topo = Topology.from_rack_sizes(rack_sizes)
    world = FakeWorld(topo.world_size)

    def mine(rank: int) -> list[tuple]:
        with world._cond:
            return [c[1:] for c in world.calls if c[0] == rank]

    def body(comm):
        gen = torch.Generator().manual_seed(comm.rank)
        model = nn.Linear(3, 2)
        strategy = cls(StrategyContext(comm=comm, model=model, topology=topo, steps=steps), cls.Config(**settings))
        strategy.setup()
        opt = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        done = len(mine(comm.rank))
        out = []
        for step in range(steps):
            x = torch.randn(4, 3, generator=gen)
            strategy.compute(step, lambda x=x: strategy.training_module()(x).square().sum().backward())
            strategy.before_step(step)
            opt.step()
            strategy.after_step(step)
            calls = mine(comm.rank)
            out.append(calls[done:])
            done = len(calls)
        return out

    return world.run(body)


@pytest.mark.parametrize(("spec", "racks", "steps"), [
    ("allreduce", [2, 3], 2),
    ("hierarchical", [3, 1, 2], 2),
    ("hierarchical", [4], 1),
    ("local-sgd:period=3", [2, 2], 7),
    ("diloco:inner_steps=2", [1, 3], 5),
    ("gossip", [3, 2], 4),
    ("gossip:period=2", [2, 2, 1], 7),
    ("ds-sync", [2, 3], 5),
    ("ds-sync:world_every=4:world_first=0.25", [3, 2, 2], 10),
])
def test_each_strategy_makes_the_calls_of_its_pattern(spec, racks, steps):
    got = _calls_by_iteration(spec, racks, steps)
    topo = Topology.from_rack_sizes(racks)
    period = plan(topo).period if spec.startswith("ds-sync") else ()
    pat = pattern(spec, topo.racks(), NUMEL, steps=steps, plan_period=period)
    for rank, iterations in enumerate(got):
        for t, calls in enumerate(iterations):
            want = [c for op in pat.iteration(t) for c in _expected(op, rank)]
            assert calls == want, f"{spec} rank {rank} iteration {t}"
    assert any(calls for iterations in got for calls in iterations)  # the strategies did communicate


@pytest.mark.parametrize("name", MODELLED)
def test_the_settings_a_pattern_reads_are_its_strategys_with_the_same_defaults(name):
    config = REGISTRY[name].Config()
    for key, default in DEFAULTS[name].items():
        assert getattr(config, key) == default, f"{name}.{key}"
        assert type(getattr(config, key)) is type(default)


def test_the_registry_lists_the_modelled_strategies_in_table_order():
    assert simulated() == MODELLED


def test_a_setting_the_patterns_do_not_model_or_cannot_read_is_named():
    with pytest.raises(ValueError, match="'ensemble=swa': the simulator's model of ds-sync has the settings "
                                         "world_every, world_first"):
        read_spec("ds-sync:ensemble=swa")
    with pytest.raises(ValueError, match="'world_every=often': world_every must be of type int"):
        read_spec("ds-sync:world_every=often")
    with pytest.raises(ValueError, match="world_first must be of type float \\(a finite number\\)"):
        read_spec("ds-sync:world_first=nan")
    with pytest.raises(ValueError, match="unknown strategy 'ssp' for the simulator"):
        read_spec("ssp")
    with pytest.raises(ValueError, match="world_period a multiple of rack_period"):
        pattern("torch-hier:rack_period=3:world_period=4", [[0, 1], [2, 3]], 1.0)


def test_torch_hier_and_ddp_patterns_at_other_settings():
    racks = [[0, 1], [2, 3]]
    pat = pattern("torch-hier:rack_period=2:world_period=8", racks, 10.0)
    world, by_rack = (Op("allreduce", ((0, 1, 2, 3),), 10.0),), (Op("allreduce", ((0, 1), (2, 3)), 10.0),)
    assert [pat.iteration(t) for t in range(9)] == [world, (), by_rack, (), by_rack, (), by_rack, (), world]
    mib = 1 << 20
    ddp = pattern("ddp:bucket_cap_mb=10", racks, 25 * mib).iteration(0)
    assert [op.nbytes for op in ddp] == [mib, 10 * mib, 10 * mib, 4 * mib]


def test_sync_switch_is_bsp_on_the_servers_until_its_switch_then_asp():
    racks = [[0, 1], [2, 3]]
    bsp, asp = Op("push-pull", ((0, 1, 2, 3),), 8.0), Op("push-pull", ((0,), (1,), (2,), (3,)), 8.0)
    # round(0.5 * 10) = 5 BSP iterations, then ASP (the switch is not timed communication)
    pat = pattern("sync-switch", racks, 8.0, steps=10)
    assert [pat.iteration(t) for t in range(7)] == [(bsp,)] * 5 + [(asp,), (asp,)]
    assert pattern("sync-switch:switch_at=0.125", racks, 8.0, steps=10).iteration(0) == (bsp,)
    assert pattern("sync-switch:switch_at=0", racks, 8.0, steps=10).iteration(0) == (asp,)
    assert {pattern("sync-switch:switch_at=1", racks, 8.0, steps=10).iteration(t) for t in range(10)} == {(bsp,)}
    with pytest.raises(ValueError, match="a greedy policy switches when it measures a straggler"):
        pattern("sync-switch:policy=greedy", racks, 8.0, steps=10)


def test_the_simulator_imports_neither_torch_nor_a_strategy():
    code = ("import sys; import dssync.bench.simulate, dssync.commands.simulate; "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'dssync.strategies'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
