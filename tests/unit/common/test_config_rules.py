"""The rules of ``common.config_rules``: declared choices and ranges, names and URLs, and the rules
between keys, each broken one named at load with its key and what is allowed."""

import pytest

from rredcot.common.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("credit.method=magic", ["credit.method", "'magic'", "'rredcot'", "'grpo'", "'mc'"]),
        (
            "credit.settings.rredcot.value_space=linear",
            ["credit.settings.rredcot.value_space", "'log'", "'prob'", "'mean_token_prob'"],
        ),
        ("learner.zero_stage=5", ["learner.zero_stage", "5", "[0, 3]"]),
        ("generation.top_p=1.5", ["generation.top_p", "1.5", "[0.0, 1.0]"]),
        ("generation.temperature=2.5", ["generation.temperature", "2.5", "[0.0, 2.0]"]),
        ("generation.group_size=1", ["generation.group_size", "[2, 1000000000]"]),
        ("redis.url=http://x", ["redis.url", "redis://"]),
        ("redis.password=a\tb", ["redis.password", "***", "printable"]),
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
    ("override", "fragments"),
    [
        ("run.name=../..", ["run.name = '../..'", "letters, digits"]),
        ("run.name=.", ["run.name = '.'", "not first"]),
        ("run.name=a/b", ["run.name = 'a/b'"]),
        ("run.name=exp*", ["run.name = 'exp*'"]),
        ("run.name=exp[12]", ["run.name = 'exp[12]'"]),
        ("run.name=ex?", ["run.name = 'ex?'"]),
        ("run.name=a:b", ["run.name = 'a:b'"]),
        ("run.name=*", ["run.name = '*'", "letters, digits"]),  # not YAML (an alias): a raw ScannerError
        ("run.name=*x", ["run.name = '*x'", "letters, digits"]),
        ("run.name=@x", ["run.name = '@x'", "letters, digits"]),
        ("run.name=" + "x" * 65, ["run.name", "at most 64"]),
        ("redis.url=redis://", ["redis.url = 'redis://'", "has no host"]),
        ("redis.url=redis://localhost:port", ["redis.url", "does not parse", "rediss://"]),
        ("redis.url=redis://localhost:99999", ["redis.url", "does not parse"]),
        ("redis.url=redis://localhost:0", ["redis.url", "has port 0"]),
        ("cluster.address=10.0.0.1:abc", ["cluster.address = '10.0.0.1:abc'", "has the port 'abc'", "host:port"]),
        ("cluster.address=10.0.0.1:70000", ["cluster.address", "has the port '70000', not a number in [1, 65535]"]),
        ("cluster.address=:6379", ["cluster.address = ':6379'", "has no host"]),
        ("cluster.address=ray://", ["cluster.address", "has no host"]),
        ("redis.url=redis://localhost:6379/zero", ["redis.url", "database 'zero', not a number"]),
        ("redis.url=unix://", ["redis.url", "has no socket path"]),
        ("redis.url=localhost:6379", ["redis.url", "unix:///path/to/socket"]),
        ("credit.scorer.exit_string=''", ["credit.scorer.exit_string = ''", "non-empty", ">= 1 token"]),
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


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["redis.maxlen=1"], "redis.maxlen = 1 is not allowed; expected >= generation.prompts_per_step (2)"),
        (["model.think_end=''"], "model.think_end = '' is not allowed; expected a non-empty string"),
        (["model.think_start=''"], "model.think_start = '' is not allowed; expected a non-empty string"),
        (["model.think_start=</think>"], "model.think_end = '</think>' is not allowed; expected a tag other than"),
        (["learner.lr=inf"], "learner.lr = inf is not allowed; expected a finite number in [0.0, 10.0]"),
        (["learner.checkpoint_every_s=inf"], "learner.checkpoint_every_s = inf is not allowed; expected a finite"),
        (["learner.eps_high=inf"], "learner.eps_high = inf is not allowed; expected a finite number in [0.0, 10.0]"),
        (["run.seed=-1"], "run.seed = -1 is not allowed; expected a number in [0, 4294967293]"),
        (["run.seed=4294967294"], "run.seed = 4294967294 is not allowed"),
        (
            ["data.shuffle_seed=-1"],
            "data.shuffle_seed = -1 is not allowed; expected a number in [0, 9223372036854775807]",
        ),
        (["generation.stop=['Q:', '']"], "generation.stop = ['Q:', ''] is not allowed; expected a list of non-empty"),
        (["generation.kv_block_size=48"], "generation.kv_block_size = 48 is not allowed; expected 0 (auto) or a mult"),
        (
            ["credit.scorer.branch_attention=flex"],
            "credit.scorer.branch_attention = 'flex' is not allowed; expected 'auto' or 'dense'",
        ),
        (["cluster.gpus_per_generator=1.5"], "cluster.gpus_per_generator = 1.5 is not allowed; expected a fraction"),
        (["cluster.gpus_per_learner=2.5"], "cluster.gpus_per_learner = 2.5 is not allowed"),
    ],
)
def test_values_that_would_fail_only_later_are_refused_at_load(overrides, fragment):
    with pytest.raises(ConfigError) as e:
        load_config("tests", overrides)
    assert fragment in str(e.value), str(e.value)


def test_the_same_keys_load_where_the_rules_allow_them():
    cfg = load_config(
        "tests",
        [
            "redis.maxlen=2",
            "model.think_start=<r>",
            "model.think_end=</r>",
            "run.seed=4294967293",
            "data.shuffle_seed=4294967296",  # numpy's generators take any non-negative int
            "generation.stop=['Q:']",
            "generation.kv_block_size=64",
            "cluster.gpus_per_generator=2",
            "cluster.gpus_per_redistributor=0.5",
            "credit.scorer.branch_attention=flex",
        ],
    )
    assert cfg.redis.maxlen == 2 and cfg.generation.stop == ["Q:"] and cfg.credit.scorer.branch_attention == "flex"
    gpu = load_config("tests", ["generation.kv_block_size=16", "cluster.gpus_per_generator=1"])
    assert gpu.generation.kv_block_size == 16  # the CPU rule only
    mc = ["generation.kv_block_size=16", "cluster.gpus_per_generator=1", "credit.method=mc"]
    with pytest.raises(ConfigError, match="generation.kv_block_size = 16 is not allowed"):
        load_config("tests", mc)  # the MC engine runs on the redistributor's CPU
    assert load_config("tests", [*mc, "cluster.gpus_per_redistributor=1"]).credit.method == "mc"


def test_an_override_value_yaml_cannot_read_is_taken_as_its_text():
    """``run.name=*`` ended in YAML's ScannerError; a string key takes such a value as it is."""
    assert load_config("tests", ["data.system_prompt=*bold* [x"]).data.system_prompt == "*bold* [x"
    assert load_config("tests", ["data.system_prompt=be brief"]).data.system_prompt == "be brief"
    with pytest.raises(ConfigError, match="learner.lr"):
        load_config("tests", ["learner.lr=*"])
