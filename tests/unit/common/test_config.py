import pytest

from rredcot.common.config import (
    MOVED_KEYS,
    Config,
    ConfigError,
    available_configs,
    from_dict,
    load_config,
    to_dict,
)


def test_defaults_with_a_dataset_validate_and_round_trip():
    cfg = load_config(None, ["data.path=problems.jsonl"])  # the default task (math) reads a dataset
    assert isinstance(cfg, Config)
    assert from_dict(to_dict(cfg)) == cfg


def test_bundled_configs_load():
    names = available_configs()
    assert {"tests", "demo_cpu"} <= set(names)
    for name in names:
        load_config(name)


def test_no_load_leaves_anything_in_the_next():
    """The defaults' tree is built once a process: what one load merged into it (bundled configs'
    sections and settings, overrides, a failed load's) is in no later load."""
    fresh = load_config(None, ["data.path=problems.jsonl"])
    for name in available_configs():
        load_config(name, ["run.steps=7", "credit.settings.rredcot.uniform_mix=0.5"])
    with pytest.raises(ConfigError):
        load_config("tests", ["run.steps=7", "learner.lr=fast"])
    assert load_config(None, ["data.path=problems.jsonl"]) == fresh
    assert from_dict(to_dict(fresh)) == fresh


def test_overrides_apply_and_interpolate():
    cfg = load_config("tests", ["learner.lr=3e-6", "run.name=abc", "credit.method=grpo"])
    assert cfg.learner.lr == 3e-6 and cfg.credit.method == "grpo"
    assert cfg.run.dir.endswith("abc")


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
    ("override", "fragment"),
    [
        ("task.settings=[1,2]", "task.settings = [1, 2] is not allowed; expected a mapping: set task.settings.<key>="),
        ("credit.settings=5", "credit.settings = 5 is not allowed; expected a mapping"),
        ("learner=3", "learner = 3 is not allowed; expected a section: set learner.<key>=… (e.g. learner.lr=…)"),
        ("run=[1]", "run = [1] is not allowed; expected a section"),
        (
            "credit.segmentation.keywords.0=Wait",
            "credit.segmentation.keywords = {'0': 'Wait'} is not allowed; expected a whole list",
        ),
        (
            "credit.settings.fraction=0.3",
            "credit.settings.fraction = 0.3 is not allowed; expected a block of settings: credit.settings holds "
            "one per method, set credit.settings.<method>.fraction=…",
        ),
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


@pytest.mark.parametrize("old", sorted(MOVED_KEYS))
def test_a_moved_credit_key_names_its_new_home(old):
    """Issue 40 moved the method-specific keys out of ``credit.*``: each old key, set by an override,
    is refused with its new home (``credit.uniform_mix`` -> ``credit.settings.rredcot.uniform_mix``)."""
    with pytest.raises(ConfigError) as e:
        load_config("tests", [f"{old}=1"])
    assert str(e.value) == f"override {old} has moved: set {MOVED_KEYS[old]} instead (docs/config.md, credit)"


def test_the_moved_keys_table_by_hand_and_in_a_file(tmp_path):
    assert MOVED_KEYS["credit.segments"] == "credit.segmentation.segments"
    assert MOVED_KEYS["credit.exit_string"] == "credit.scorer.exit_string"
    assert MOVED_KEYS["credit.scorer"] == "credit.scorer.model"
    assert MOVED_KEYS["credit.uniform_mix"].startswith("credit.settings.rredcot.uniform_mix")
    assert MOVED_KEYS["credit.mc_samples"] == "credit.settings.mc.samples"
    assert len(MOVED_KEYS) == 24  # every key the old flat credit section had beside the four that stay
    assert set(MOVED_KEYS).isdisjoint(f"credit.{k}" for k in ("method", "advantage_std_norm", "save_traces"))
    (f := tmp_path / "old.yaml").write_text("task:\n  name: arith\ncredit:\n  scorer: policy\n  uniform_mix: 0.3\n")
    with pytest.raises(ConfigError, match=rf"config file {f}: credit.scorer has moved: set credit.scorer.model"):
        load_config(f)
    assert load_config("tests", ["credit.scorer.model=policy"]).credit.scorer.model == "policy"  # the section
