"""``redistributor.methods``: the built-ins' settings, their checks between config keys, their
provers, and a registration light enough for the config to check them without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rredcot.common.config import ConfigError, load_config, resolve_credit
from rredcot.redistributor.methods import McSettings, ProgressSettings, RredcotSettings, ValueSettings


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            ["credit.method=bnpo"],
            "learner.loss_agg = 'sample' is not allowed; expected 'token' with credit.method=bnpo",
        ),
        (
            ["credit.method=drgrpo"],
            "credit.advantage_std_norm = True is not allowed; expected false with credit.method",
        ),
        (
            ["credit.method=drgrpo", "credit.advantage_std_norm=false", "learner.loss_agg=token"],
            "learner.loss_agg = 'token' is not allowed; expected 'sample' with credit.method=drgrpo",
        ),
        (
            ["credit.settings.rredcot.answer_part=terminal"],
            "credit.settings.rredcot.value_space = 'log' is not allowed; expected 'prob' or 'mean_token_prob' "
            "with credit.settings.rredcot.answer_part",
        ),
        (
            ["credit.settings.rredcot.answer_part=segment"],
            "credit.settings.rredcot.answer_part = 'segment' is not allowed; expected one of",
        ),
    ],
)
def test_methods_require_the_learner_settings_that_define_them(overrides, fragment):
    """Each method's ``check`` (bnpo, drgrpo, rredcot) runs while the config is loaded."""
    with pytest.raises(ConfigError, match=fragment):
        load_config("tests", overrides)
    load_config("tests", ["credit.method=bnpo", "learner.loss_agg=token"])
    load_config("tests", ["credit.method=drgrpo", "credit.advantage_std_norm=false"])
    load_config("tests", ["credit.settings.rredcot.answer_part=terminal", "credit.settings.rredcot.value_space=prob"])
    mc = ["credit.method=mc", "credit.settings.mc.answer_part=terminal"]
    load_config("tests", mc)  # MC values are probabilities


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            ["credit.settings.rredcot.reference=answer", "credit.settings.rredcot.suffix_window=2"],
            "credit.settings.rredcot.suffix_window = 2 is not allowed; expected 0 (its default) with "
            "credit.settings.rredcot.reference='answer': only reference=suffix scores suffix starts; set "
            "credit.settings.rredcot.reference=suffix, or leave suffix_window unset",
        ),
        (
            [
                "credit.method=shuffled",
                "credit.settings.rredcot.reference=solution",
                "credit.settings.rredcot.max_suffixes=3",
            ],
            "credit.settings.rredcot.max_suffixes = 3 is not allowed; expected 8 (its default) with "
            "credit.settings.rredcot.reference='solution'",
        ),
        (
            ["credit.settings.rredcot.softmax_temperature=0.5"],
            "credit.settings.rredcot.softmax_temperature = 0.5 is not allowed; expected 1.0 (its default) with "
            "credit.settings.rredcot.sign='relu': only sign=softmax uses a temperature",
        ),
        (
            ["credit.method=mc", "credit.settings.mc.sign=abs", "credit.settings.mc.softmax_temperature=2"],
            "credit.settings.mc.softmax_temperature = 2.0 is not allowed; expected 1.0 (its default) with "
            "credit.settings.mc.sign='abs'",
        ),
    ],
)
def test_a_setting_that_the_settings_around_it_leave_unused_is_an_error_naming_both(overrides, fragment):
    """Issue 62: suffix_window > 0 with reference=answer (and max_suffixes with another reference, a
    temperature without sign=softmax) was ignored without a word."""
    with pytest.raises(ConfigError) as e:
        load_config("tests", overrides)
    assert fragment in str(e.value)
    load_config("tests", ["credit.settings.rredcot.suffix_window=2", "credit.settings.rredcot.max_suffixes=3"])
    load_config("tests", ["credit.settings.rredcot.reference=answer", "credit.settings.rredcot.suffix_window=0"])
    load_config("tests", ["credit.settings.rredcot.sign=softmax", "credit.settings.rredcot.softmax_temperature=0.5"])
    load_config(
        "tests",
        ["credit.method=grpo", "credit.settings.rredcot.reference=answer", "credit.settings.rredcot.suffix_window=2"],
    )


def test_only_the_chosen_methods_check_runs():
    """A run of grpo keeps rredcot's block as it is (checked key by key, not against rredcot's rule)."""
    cfg = load_config("tests", ["credit.method=grpo", "credit.settings.rredcot.answer_part=terminal"])
    assert cfg.credit.settings["rredcot"] == {"answer_part": "terminal"}


def test_each_method_declares_the_continuations_it_samples():
    def prover(*overrides: str) -> str | None:
        return resolve_credit(load_config("tests", list(overrides))).prover

    assert prover() is None and prover("credit.method=entropy") is None
    assert prover("credit.method=mc") == "policy"
    assert prover("credit.method=progress") == "initial"  # its settings' prover
    assert prover("credit.method=progress", "credit.settings.progress.prover=policy") == "policy"
    assert prover("credit.method=progress", "credit.settings.progress.prover=tiny-qwen2") == "tiny-qwen2"


def test_the_value_methods_share_their_value_settings():
    shared = {"value_space", "sign", "softmax_temperature", "uniform_mix", "answer_part"}
    assert issubclass(RredcotSettings, ValueSettings) and issubclass(McSettings, ValueSettings)
    assert set(ValueSettings.__dataclass_fields__) == shared
    assert set(McSettings.__dataclass_fields__) == shared | {"samples"}
    assert set(ProgressSettings.__dataclass_fields__) == {"alpha", "prover", "samples", "answer_part"}
    assert RredcotSettings() == RredcotSettings("log", "relu", 1.0, 0.3, "uniform", False, "suffix", 8, 0, "group", 4)
    assert McSettings().uniform_mix == 0.0  # λ = 0.3 was measured for rredcot's σ only (docs/study.md)


def test_checking_any_methods_settings_imports_no_torch():
    """``rredcot config show`` stays cheap: the built-ins register in a light module."""
    code = (
        "import sys\n"
        "from rredcot.common.config import load_config\n"
        "for m, key in (('mc', 'samples=2'), ('progress', 'alpha=0.5'), ('top_entropy', 'fraction=0.3')):\n"
        "    load_config('tests', [f'credit.method={m}', f'credit.settings.{m}.{key}'])\n"
        "assert 'torch' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
