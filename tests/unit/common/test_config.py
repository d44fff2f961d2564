import pytest

from rredcot.common.config import Config, ConfigError, available_configs, from_dict, load_config, to_dict


def test_defaults_with_a_dataset_validate_and_round_trip():
    cfg = load_config(None, ["data.path=problems.jsonl"])  # the default task (math) reads a dataset
    assert isinstance(cfg, Config)
    assert from_dict(to_dict(cfg)) == cfg


def test_bundled_configs_load():
    names = available_configs()
    assert {"tests", "demo_cpu"} <= set(names)
    for name in names:
        load_config(name)


def test_overrides_apply_and_interpolate():
    cfg = load_config("tests", ["learner.lr=3e-6", "run.name=abc", "credit.method=grpo"])
    assert cfg.learner.lr == 3e-6 and cfg.credit.method == "grpo"
    assert cfg.run.dir.endswith("abc")


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("credit.method=magic", ["credit.method", "'magic'", "'rredcot'", "'grpo'", "'mc'"]),
        ("credit.value_space=linear", ["credit.value_space", "'log'", "'prob'", "'mean_token_prob'"]),
        ("learner.zero_stage=5", ["learner.zero_stage", "5", "[0, 3]"]),
        ("generation.top_p=1.5", ["generation.top_p", "1.5", "[0.0, 1.0]"]),
        ("generation.group_size=1", ["generation.group_size", ">= 2"]),
        ("redis.url=http://x", ["redis.url", "redis://"]),
        ("generation.max_tokens=5000", ["generation.max_tokens", "model.max_model_len"]),
        ("learner.micro_token_budget=100", ["learner.micro_token_budget", "100", "model.max_model_len (512)"]),
    ],
)
def test_invalid_values_name_key_value_and_allowed(override, fragments):
    with pytest.raises(ConfigError) as e:
        load_config("tests", [override])
    for frag in fragments:
        assert frag in str(e.value), (frag, str(e.value))


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
            ["credit.answer_part=terminal"],
            "credit.value_space = 'log' is not allowed; expected 'prob' or 'mean_token_prob' with credit.answer_part",
        ),
        (["credit.answer_part=segment"], "credit.answer_part = 'segment' is not allowed; expected one of"),
    ],
)
def test_methods_require_the_learner_settings_that_define_them(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config("tests", overrides)
    load_config("tests", ["credit.method=bnpo", "learner.loss_agg=token"])
    load_config("tests", ["credit.method=drgrpo", "credit.advantage_std_norm=false"])
    load_config("tests", ["credit.answer_part=terminal", "credit.value_space=prob"])
    load_config("tests", ["credit.answer_part=terminal", "credit.method=mc"])  # MC values are probabilities


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(ConfigError) as e:
        load_config("tests", ["learner.learning_rate=1"])
    msg = str(e.value)
    assert "learner.learning_rate" in msg and "lr" in msg and "zero_stage" in msg


def test_type_error_names_key():
    with pytest.raises(ConfigError, match="learner.lr"):
        load_config("tests", ["learner.lr=fast"])


def test_missing_file_lists_bundled():
    with pytest.raises(ConfigError, match="tests"):
        load_config("nope.yaml")


def test_malformed_override():
    with pytest.raises(ConfigError, match="key=value"):
        load_config("tests", ["learner.lr"])
