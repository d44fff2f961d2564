"""``common.credit_spec``: ``credit.method`` resolved once (entry, typed settings, prover), and every
block of ``credit.settings`` checked whichever method runs."""

from __future__ import annotations

import pytest

from rredcot.common.config import ConfigError, load_config, resolve_credit
from rredcot.common.registry import CREDIT_METHODS


def test_the_method_comes_with_its_settings_and_its_prover():
    spec = resolve_credit(load_config("tests", ["credit.settings.rredcot.uniform_mix=0.5"]))
    assert spec.method is CREDIT_METHODS.get("rredcot") and spec.settings_key == "credit.settings.rredcot"
    assert spec.settings.uniform_mix == 0.5 and spec.settings.reference == "suffix"  # the rest: defaults
    assert spec.prover is None and not spec.method.needs_sampler
    grpo = resolve_credit(load_config("tests", ["credit.method=grpo"]))
    assert grpo.settings is None and grpo.prover is None


def test_a_config_holds_other_methods_settings_and_keeps_them_when_the_method_switches(tmp_path):
    """``rredcot study compare`` runs every arm on one base config: its rredcot block stays (unused)
    under another method, and an override that switches the method drops no block."""
    (f := tmp_path / "c.yaml").write_text(
        "task:\n  name: arith\ncredit:\n  method: rredcot\n  settings:\n    rredcot: {uniform_mix: 0.3}\n"
    )
    cfg = load_config(f, ["credit.method=mc", "credit.settings.mc.samples=2"])
    assert cfg.credit.settings == {"rredcot": {"uniform_mix": 0.3}, "mc": {"samples": 2}}
    spec = resolve_credit(cfg)
    assert spec.settings.samples == 2 and spec.settings.uniform_mix == 0.0  # mc's own block, not rredcot's


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["credit.settings.mc.sampels=2"], "unknown key credit.settings.mc.sampels; keys allowed under"),
        (["credit.settings.progress.alpha=-1"], "credit.settings.progress.alpha = -1.0 is not allowed"),
        (["credit.settings.top_entropy.fraction=0"], "credit.settings.top_entropy.fraction = 0.0 is not allowed"),
        (["credit.settings.rredcot.reference=whole"], "credit.settings.rredcot.reference = 'whole' is not allowed"),
        (["credit.settings.grpo.x=1"], "credit.settings.grpo = {'x': 1} is not allowed; expected {}"),
        (["credit.settings.progress.alpha=big"], "invalid value for credit.settings.progress.alpha"),
    ],
)
def test_every_block_is_checked_whichever_method_runs(overrides, fragment):
    """A typo or a bad value in another method's block is an error naming its key: the config that
    holds it would fail only when an arm switched to that method."""
    for method in ("rredcot", "grpo"):
        with pytest.raises(ConfigError) as e:
            load_config("tests", [f"credit.method={method}", *overrides])
        assert fragment in str(e.value), str(e.value)


def test_a_block_of_no_method_names_it_and_the_registered_ones():
    with pytest.raises(ConfigError) as e:
        load_config("tests", ["credit.settings.magic.alpha=1"])
    msg = str(e.value)
    assert msg.startswith("credit.settings.magic (settings are keyed by credit method: credit.settings.<method>.<key>)")
    assert all(f"'{name}'" in msg for name in ("rredcot", "mc", "progress", "grpo")), msg


def test_a_module_paths_block_is_keyed_by_its_path_or_the_name_it_registered(tmp_path):
    method = "credit.method=tests.extensions.last_token"
    assert resolve_credit(load_config("tests", [method, "credit.settings.last_token.tail=2"])).settings.tail == 2
    (f := tmp_path / "c.yaml").write_text(
        "task:\n  name: arith\ncredit:\n  method: tests.extensions.last_token\n"
        "  settings:\n    tests.extensions.last_token: {tail: 3}\n"
    )
    spec = resolve_credit(load_config(f))
    assert spec.settings.tail == 3 and spec.settings_key == "credit.settings.tests.extensions.last_token"
    with pytest.raises(ConfigError, match="credit.settings.tests.extensions.last_token and credit.settings.last_tok"):
        load_config(f, ["credit.settings.last_token.tail=2"])
