"""``Strategy.Config.read``: ``--set`` text read as each field's own type, for every strategy."""

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dssync.strategies import REGISTRY

FIELDS = [(name, f) for name, cls in REGISTRY.items() for f in dataclasses.fields(cls.Config)]


def _text(value):
    return str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, float) else str(value)


@pytest.mark.parametrize(("name", "field"), FIELDS, ids=[f"{n}.{f.name}" for n, f in FIELDS])
def test_every_default_reads_back_as_itself_with_its_type(name, field):
    config = REGISTRY[name].Config
    got = config.read([f"{field.name}={_text(field.default)}"], name)
    assert got == {field.name: field.default}
    assert type(got[field.name]) is type(field.default)
    config(**got)  # and validates


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_float_setting_takes_exactly_the_finite_numbers(x):
    config = REGISTRY["diloco"].Config
    if math.isfinite(x):
        assert config.read([f"outer_lr={x!r}"]) == {"outer_lr": x}
    else:
        with pytest.raises(ValueError, match="outer_lr must be of type float"):
            config.read([f"outer_lr={x!r}"])


@pytest.mark.parametrize("text", ["yes", "", "2", "True!"])
def test_a_bool_setting_refuses_what_is_not_true_false_1_or_0(text):
    with pytest.raises(ValueError, match="overlap must be of type bool"):
        REGISTRY["ds-sync"].Config.read([f"overlap={text}"])


def test_a_jobs_strategy_settings_are_checked_once_when_the_job_is_configured():
    from dssync.training.loop import TrainConfig

    cfg = TrainConfig(strategy="ds-sync", strategy_options={"max_pace": 2})
    assert cfg.strategy_config == REGISTRY["ds-sync"].Config(max_pace=2)
    with pytest.raises(ValueError, match="max_pace must be 1"):
        TrainConfig(strategy="ds-sync", strategy_options={"max_pace": 0})
    with pytest.raises(ValueError, match="allreduce has no setting max_pace; its settings: none"):
        TrainConfig(strategy="allreduce", strategy_options={"max_pace": 2})
