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
            ["credit.branch_attention=flex"],
            "credit.branch_attention = 'flex' is not allowed; expected 'auto' or 'dense'",
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
            "credit.branch_attention=flex",
        ],
    )
    assert cfg.redis.maxlen == 2 and cfg.generation.stop == ["Q:"] and cfg.credit.branch_attention == "flex"
    gpu = load_config("tests", ["generation.kv_block_size=16", "cluster.gpus_per_generator=1"])
    assert gpu.generation.kv_block_size == 16  # the CPU rule only
    mc = ["generation.kv_block_size=16", "cluster.gpus_per_generator=1", "credit.method=mc"]
    with pytest.raises(ConfigError, match="generation.kv_block_size = 16 is not allowed"):
        load_config("tests", mc)  # the MC engine runs on the redistributor's CPU
    assert load_config("tests", [*mc, "cluster.gpus_per_redistributor=1"]).credit.method == "mc"


def test_the_seed_bound_leaves_room_for_the_engines_offsets():
    from rredcot.actors.continuations import MC_SEED_OFFSET
    from rredcot.common.config import SEED_MAX

    assert SEED_MAX + MC_SEED_OFFSET == 2**32 - 1  # vLLM seeds numpy with run.seed + offset: 32 bits


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("task.settings=[1,2]", "task.settings = [1, 2] is not allowed; expected a mapping: set task.settings.<key>="),
        ("credit.settings=5", "credit.settings = 5 is not allowed; expected a mapping"),
        ("learner=3", "learner = 3 is not allowed; expected a section: set learner.<key>=… (e.g. learner.lr=…)"),
        ("run=[1]", "run = [1] is not allowed; expected a section"),
        ("credit.keywords.0=Wait", "credit.keywords = {'0': 'Wait'} is not allowed; expected a whole list"),
        ("learner.lr=", "override 'learner.lr=' has no value (use learner.lr=null for null)"),
        ("model.tokenizer= ", "override 'model.tokenizer= ' has no value (use model.tokenizer=null for null)"),
    ],
)
def test_a_wrong_shape_or_an_empty_override_names_the_key(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config("tests", [override])
    assert fragment in str(e.value), str(e.value)


def test_a_section_left_empty_in_a_file_names_it(tmp_path):
    (f := tmp_path / "c.yaml").write_text("task:\n  name: arith\nlearner:\n")
    with pytest.raises(ConfigError, match="learner = None is not allowed; expected a section"):
        load_config(f)


def test_only_a_bare_name_falls_back_to_a_bundled_config(tmp_path, monkeypatch):
    for missing in (tmp_path / "demo_cpu.yaml", "nope/demo_cpu.yaml", "./tests"):
        with pytest.raises(ConfigError, match=f"config file '{missing}' not found"):
            load_config(missing)
    monkeypatch.chdir(tmp_path)  # no configs/ here: the names are the bundled ones
    assert load_config("demo_cpu").run.name == load_config("demo_cpu.yaml").run.name
    (tmp_path / "tests").write_text("task:\n  name: arith\nrun:\n  name: mine\n")
    assert load_config("tests").run.name == "mine"  # an existing file path wins over a bundled name


def bounded_fields(cls: type, prefix: str = "") -> list[tuple[str, tuple]]:
    """(dotted key, (lo, hi)) of every ranged number of a settings dataclass tree."""
    import dataclasses

    out = []
    for f in dataclasses.fields(cls):
        if "range" in f.metadata:
            out.append((prefix + f.name, f.metadata["range"]))
        elif dataclasses.is_dataclass(f.type if isinstance(f.type, type) else None):
            out += bounded_fields(f.type, f"{prefix}{f.name}.")
    return out


def test_every_number_of_the_config_and_the_builtin_settings_has_an_upper_bound():
    """A probe set redis.maxlen=1e23 and cluster.max_restarts=1e20: they passed the config and failed,
    if at all, deep inside a library. Every ranged number now has an upper bound."""
    import dataclasses

    from rredcot.redistributor.credit import TopEntropySettings
    from rredcot.redistributor.progress import ProgressSettings
    from rredcot.tasks.arith import ArithSettings
    from rredcot.tasks.choice import ChoiceSettings

    sections = [(f.name, f.default_factory) for f in dataclasses.fields(Config)]
    keys = [(f"{name}.{k}", r) for name, cls in sections for k, r in bounded_fields(cls)]
    for cls in (TopEntropySettings, ProgressSettings, ArithSettings, ChoiceSettings):
        keys += bounded_fields(cls, f"{cls.__name__}.")
    assert len(keys) > 60
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
