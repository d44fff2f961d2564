"""The schema of ``common.config_schema``: every number bounded, and bounds that fit what the
libraries take."""

import pytest

from rredcot.common.config import Config, ConfigError, load_config


def test_the_seed_bound_leaves_room_for_the_engines_offsets():
    from rredcot.actors.continuations import MC_SEED_OFFSET
    from rredcot.common.config import SEED_MAX

    assert SEED_MAX + MC_SEED_OFFSET == 2**32 - 1  # vLLM seeds numpy with run.seed + offset: 32 bits


def bounded_fields(cls: type, prefix: str = "") -> list[tuple[str, tuple]]:
    """(dotted key, (lo, hi)) of every ranged number of a settings dataclass tree."""
    import dataclasses

    out = []
    for f in dataclasses.fields(cls):
        if "range" in f.metadata:
            out.append((prefix + f.name, f.metadata["range"]))
        elif isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):  # a section
            out += bounded_fields(f.default_factory, f"{prefix}{f.name}.")
    return out


def test_every_number_of_the_config_and_the_builtin_settings_has_an_upper_bound():
    """A probe set redis.maxlen=1e23 and cluster.max_restarts=1e20: they passed the config and failed,
    if at all, deep inside a library. Every ranged number now has an upper bound."""
    import dataclasses

    from rredcot.redistributor.methods import McSettings, ProgressSettings, RredcotSettings, TopEntropySettings
    from rredcot.tasks.arith import ArithSettings
    from rredcot.tasks.choice import ChoiceSettings

    sections = [(f.name, f.default_factory) for f in dataclasses.fields(Config)]
    keys = [(f"{name}.{k}", r) for name, cls in sections for k, r in bounded_fields(cls)]
    for cls in (TopEntropySettings, RredcotSettings, McSettings, ProgressSettings, ArithSettings, ChoiceSettings):
        keys += bounded_fields(cls, f"{cls.__name__}.")
    assert (
        len(keys) > 60 and "credit.segmentation.segments" in dict(keys) and "credit.scorer.token_budget" in dict(keys)
    )
    assert [k for k, (_, hi) in keys if hi is None] == []


@pytest.mark.parametrize(
    "override",
    [
        "redis.maxlen=100000000000",
        "redis.maxlen=1e23",
        "generation.verifier_timeout_s=1e300",
        "redis.block_timeout_s=1e300",
        "cluster.max_restarts=100000000000000000000",
        "redis.claim_idle_ms=1000000000000",
    ],
)
def test_absurd_numbers_are_refused_before_anything_starts(override):
    """Each names its key and the allowed range (``redis.maxlen=1e23``, a float for an integer key,
    is refused by OmegaConf's type check, also naming the key)."""
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}\b.*(not allowed|could not be converted)"):
        load_config("tests", [override])
