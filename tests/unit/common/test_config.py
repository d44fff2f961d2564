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
        ("generation.temperature=2.5", ["generation.temperature", "2.5", "[0.0, 2.0]"]),
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


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("run.name=../..", ["run.name = '../..'", "letters, digits"]),
        ("run.name=.", ["run.name = '.'", "not first"]),
        ("run.name=a/b", ["run.name = 'a/b'"]),
        ("run.name=exp*", ["run.name = 'exp*'"]),
        ("run.name=exp[12]", ["run.name = 'exp[12]'"]),
        ("run.name=ex?", ["run.name = 'ex?'"]),
        ("run.name=a:b", ["run.name = 'a:b'"]),
        ("run.name=" + "x" * 65, ["run.name", "at most 64"]),
        ("redis.url=redis://", ["redis.url = 'redis://'", "has no host"]),
        ("redis.url=redis://localhost:port", ["redis.url", "does not parse", "rediss://"]),
        ("redis.url=redis://localhost:99999", ["redis.url", "does not parse"]),
        ("redis.url=redis://localhost:0", ["redis.url", "has port 0"]),
        ("redis.url=redis://localhost:6379/zero", ["redis.url", "database 'zero', not a number"]),
        ("redis.url=unix://", ["redis.url", "has no socket path"]),
        ("redis.url=localhost:6379", ["redis.url", "unix:///path/to/socket"]),
        ("credit.exit_string=''", ["credit.exit_string = ''", "non-empty", ">= 1 token"]),
        ("cluster.cpus_per_redistributor=0", ["cluster.cpus_per_redistributor = 0.0", "gpus_per_redistributor is 0"]),
    ],
)
def test_names_urls_and_exit_string_are_checked_at_load(override, fragments):
    with pytest.raises(ConfigError) as e:
        load_config("tests", [override])
    assert "\n" not in str(e.value)
    for frag in fragments:
        assert frag in str(e.value), (frag, str(e.value))


def test_a_worker_on_a_gpu_may_ask_for_no_cpu():
    cfg = load_config("tests", ["cluster.cpus_per_learner=0", "cluster.gpus_per_learner=1"])
    assert cfg.cluster.cpus_per_learner == 0


def test_a_bad_redis_url_error_does_not_show_its_password():
    with pytest.raises(ConfigError) as e:
        load_config("tests", ["redis.url=redis://:hunter2@localhost:port/0"])
    assert "hunter2" not in str(e.value) and "redis://:***@localhost:port/0" in str(e.value)


@pytest.mark.parametrize(
    "url",
    ["redis://localhost", "redis://:pw@10.0.0.1:6380/2", "rediss://user:pw@redis.example:6379", "unix:///tmp/r.sock"],
)
def test_good_redis_urls_and_run_names_load(url):
    cfg = load_config("tests", [f"redis.url={url}", "run.name=exp-2_v1.0"])
    assert cfg.redis.url == url and cfg.run.dir.endswith("runs/exp-2_v1.0")
