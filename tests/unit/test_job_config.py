"""A job's settings as one typed object: ``TrainConfig`` to JSON and back (what ``dssync train
--config`` and the benchmarks carry to the ranks), and a comparison's variants as configs."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dssync.bench.compare import variant_config
from dssync.planning.schedule import Schedule
from dssync.strategies import REGISTRY
from dssync.topology import Topology
from dssync.training.loop import LR_SCHEDULES, OPTIMIZERS, TrainConfig

STRATEGIES = sorted(REGISTRY)


@st.composite
def configs(draw):
    """A valid config of any strategy, with random plain settings, racks and a schedule."""
    strategy = draw(st.sampled_from(STRATEGIES))
    steps = draw(st.integers(2, 5000))
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    topology = draw(st.none() | st.just(Topology.from_rack_sizes(sizes)))
    n = sum(sizes)
    schedule = draw(st.none() | st.just(Schedule(world_size=n, period=((tuple(range(n)),),))))
    return TrainConfig(
        strategy=strategy, steps=steps, seed=draw(st.integers(0, 10**6)),
        batch_size=draw(st.integers(1, 512)), lr=draw(st.floats(1e-5, 10.0)),
        momentum=draw(st.floats(0.0, 0.99)), optimizer=draw(st.sampled_from(OPTIMIZERS)),
        weight_decay=draw(st.floats(0.0, 0.5)), lr_schedule=draw(st.sampled_from(LR_SCHEDULES)),
        warmup_steps=draw(st.integers(0, steps - 1)), target_accuracy=draw(st.none() | st.floats(0.01, 1.0)),
        topology=topology, schedule=schedule, probe_first=draw(st.booleans()),
        timeout_s=draw(st.floats(1.0, 1e4)), num_racks=draw(st.integers(1, 8)))


@settings(max_examples=60, deadline=None)
@given(configs())
def test_a_config_survives_json_as_itself(cfg):
    back = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back.to_dict() == cfg.to_dict()
    assert back.strategy_config == cfg.strategy_config
    for name in ("lr", "steps", "seed", "target_accuracy", "warmup_steps", "probe_first"):
        assert getattr(back, name) == getattr(cfg, name)
        assert type(getattr(back, name)) is type(getattr(cfg, name))


def test_strategy_settings_keep_their_types_through_json():
    cfg = TrainConfig(strategy="psp", strategy_options={"pull_fraction": 1.0, "push_quorum": 3, "seed": 2})
    back = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back.strategy_config == cfg.strategy_config
    # a JSON integer where the setting is a float is that float
    data = dict(cfg.to_dict(), strategy_options={"pull_fraction": 1})
    assert type(TrainConfig.from_dict(data).strategy_config.pull_fraction) is float


@pytest.mark.parametrize(("change", "needle"), [
    ({"version": 2}, '"version" must be 1'),
    ({"lr": "0.1"}, "lr must be"),
    ({"steps": True}, "steps must be"),
    ({"steps": 2.5}, "steps must be"),
    ({"frobnicate": 1}, "unknown settings ['frobnicate']"),
    ({"strategy_options": {"push_quorum": "3"}}, "psp's push_quorum must be"),
    ({"strategy_options": {"quorum": 3}}, "psp has no setting quorum"),
    ({"strategy_options": [1]}, "strategy_options must be a JSON object"),
    ({"topology": {"version": 1, "workers": "x"}}, "topology"),
    ({"lr": -1.0}, "lr must be a positive number"),
    ({"strategy": "nope"}, "unknown strategy 'nope'"),
])
def test_a_bad_config_is_refused_and_named(change, needle):
    data = dict(TrainConfig(strategy="psp").to_dict(), **change)
    with pytest.raises(ValueError) as info:
        TrainConfig.from_dict(data, source="job.json")
    assert needle in str(info.value)


def test_a_config_without_a_strategy_or_not_an_object_is_refused():
    with pytest.raises(ValueError, match='"strategy" is missing'):
        TrainConfig.from_dict({"version": 1})
    with pytest.raises(ValueError, match="a job config is a JSON object"):
        TrainConfig.from_dict([1, 2])


def test_a_variant_is_its_strategys_settings_over_the_comparisons():
    common = {"task": "digits", "lr": 0.15, "weight_decay": 0.0, "topology": Topology.from_rack_sizes([2, 2])}
    cfg = variant_config("asp:scale_lr=false:--optimizer=sgd:--lr=0.03:--weight-decay=0.01", common,
                         seed=3, target_accuracy=0.9, adjust_every=25)
    assert (cfg.strategy, cfg.lr, cfg.weight_decay, cfg.seed, cfg.target_accuracy) == ("asp", 0.03, 0.01, 3, 0.9)
    assert cfg.strategy_options == {"scale_lr": False}  # asp does not regroup: no adjust_every
    assert variant_config("ds-sync", common, adjust_every=25).strategy_options == {"adjust_every": 25}
    # the variant's own setting wins over the comparison's interval
    assert variant_config("ds-sync:adjust_every=5", common, adjust_every=25).strategy_options == {"adjust_every": 5}


@pytest.mark.parametrize(("spec", "needle"), [
    ("ddp:--lr=abc", "lr must be of type float"),
    ("ddp:--optimizer=adam", "unknown optimizer 'adam'"),
    ("ddp:--frobnicate=1", "write --OPTION=VALUE"),
    ("psp:push_quorum=x", "push_quorum must be of type int"),
])
def test_a_bad_variant_is_refused_and_named(spec, needle):
    with pytest.raises(ValueError, match=None) as info:
        variant_config(spec, {"task": "digits"})
    assert needle in str(info.value)
