"""Structured run configuration: dataclasses, YAML + dotlist loading, validation.

Every field that takes one of a fixed set of values declares it with ``choice(...)``; every
bounded number declares its range with ``bounded(...)``. ``validate`` walks the tree and raises
``ConfigError`` naming the key, the value and what is allowed, before anything starts. (Over 400
lines on purpose: every key with its default, range and choices is in this one file, which
docs/config.md mirrors key for key.)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rredcot.common.errors import UserError
from rredcot.common.registry import CREDIT_METHODS, WEIGHT_TRANSPORTS, RegistryError, typed_settings

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
# vLLM seeds numpy (32 bits) with run.seed plus an offset of up to 2 (actors.continuations.MC_SEED_OFFSET)
SEED_MAX = 2**32 - 1 - 2
# Upper bounds of the numbers below: past any real run, and inside what the libraries take (Ray's and
# torch's int32/int64 counts, Python's poll/select and torch's timedelta timeouts, Redis's int64 ms)
COUNT_MAX = 10**9  # steps, groups, samples, tokens, entries, restarts
SECONDS_MAX = 7 * 86_400.0  # timeouts and intervals: a week
BYTES_MAX = 2**44  # 16 TiB
NODES_MAX = 100_000  # nodes, workers per tier, CPUs and GPUs per worker
PROBLEMS_MAX = 10**7  # problems a builtin task generates (held in memory)


class ConfigError(UserError):
    """An invalid configuration value; the message names the key and what is allowed."""

    label = "config error"


def choice(default: str, *allowed: str) -> Any:
    """A string field restricted to ``allowed`` (``default`` must be one of them)."""
    assert default in allowed, (default, allowed)
    return field(default=default, metadata={"choices": allowed})


def bounded(default: float, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Any:
    """A numeric field with an inclusive range [lo, hi] (None = unbounded on that side; (lo, hi]
    when ``lo_open``)."""
    return field(default=default, metadata={"range": (lo, hi), "lo_open": lo_open})


@dataclass
class RunConfig:
    name: str = "run"
    dir: str = "runs/${run.name}"
    seed: int = bounded(0, 0, SEED_MAX)
    # varies only the generators' and the evaluator's sampling, not the problems, their order or a
    # builtin model's initialisation: what ``rredcot study compare --seeds`` sets
    sampling_seed: int = bounded(0, 0, SEED_MAX)
    steps: int = bounded(10, 1, COUNT_MAX)
    resume: str = choice("never", "never", "auto")


@dataclass
class ModelConfig:
    path: str = "tiny-qwen3"  # HF dir, hub id, or a builtin: tiny-qwen3 | tiny-qwen2 | smollm2-135m[-chain]
    tokenizer: str | None = None  # defaults to the model's own
    dtype: str = choice("auto", "auto", "float32", "bfloat16")  # generators and the scorer; auto: bf16 where native
    max_model_len: int = bounded(1024, 16, COUNT_MAX)
    think_start: str = "<think>"
    think_end: str = "</think>"


@dataclass
class TaskConfig:
    name: str = "math"  # a registered task (common.registry.TASKS) or your module's path (mypkg.mytask)
    settings: dict[str, Any] = field(default_factory=dict)  # the task's own settings (its Settings dataclass)


@dataclass
class DataConfig:
    source: str = choice("hf", "hf", "jsonl", "parquet")  # where a dataset task (math) reads its rows
    path: str | None = None  # file for jsonl/parquet; dataset dir or hub id for hf
    split: str = "train"
    problem_column: str = "problem"
    solution_column: str = "solution"
    answer_column: str | None = "answer"  # None or missing: last \boxed{} of the solution
    eval_size: int = bounded(64, 0, COUNT_MAX)  # held out (never trained on)
    shuffle_seed: int = bounded(0, 0, 2**63 - 1)  # numpy's generators take any non-negative int
    prompt_style: str = choice("chat_one_shot", "chat_one_shot", "chat", "plain")
    system_prompt: str | None = None
    max_file_bytes: int = bounded(2**32, 1, BYTES_MAX)  # a jsonl/parquet file larger than this is refused
    max_row_bytes: int = bounded(2**20, 1, BYTES_MAX)  # a row whose problem, solution and answer exceed this is refused


@dataclass
class GenerationConfig:
    group_size: int = bounded(4, 2, COUNT_MAX)
    prompts_per_step: int = bounded(4, 1, COUNT_MAX)
    temperature: float = bounded(1.0, 0.0, 2.0)  # vLLM refuses > 2
    top_p: float = bounded(1.0, 0.0, 1.0)
    max_tokens: int = bounded(64, 1, COUNT_MAX)
    stop: list[str] = field(default_factory=list)
    kv_cache_bytes: int = bounded(256 * 2**20, 2**20, BYTES_MAX)
    # KV-cache block (tokens); 0: 32 on CPU (vLLM-CPU's smallest; its 128 default leaves short prompts
    # with no full block to share, so every sample re-prefills its prompt), vLLM's default on GPU
    kv_block_size: int = bounded(0, 0, COUNT_MAX)
    in_flight: str = choice("finish", "finish", "pause")  # running requests on a weight update
    verifier_timeout_s: float = bounded(5.0, 0.01, SECONDS_MAX)
    max_in_flight_groups: int = bounded(16, 1, COUNT_MAX)  # groups one generator keeps in its engine at once
    # DAPO's dynamic sampling: a group whose samples all got one reward (no advantage) is dropped at the
    # generator and another prompt admitted in its place, so each step trains on groups with a signal
    drop_uniform_groups: bool = False
    # completions cut at max_tokens (common/overlong.py): none; penalty, a reward ramping to -1 over the
    # last overlong_window tokens (DAPO's soft punishment); filter, no advantage for a truncated sample
    overlong: str = choice("none", "none", "penalty", "filter")
    overlong_window: int = bounded(0, 0, COUNT_MAX)  # tokens; 0: max_tokens // 4
    idle_poll_s: float = bounded(0.05, 0.001, SECONDS_MAX)  # wait between admission retries while staleness blocks
    weight_transport: str = "file"  # a registered transport (file, collective, ipc: common.transports) or a module path
    transport_settings: dict[str, Any] = field(default_factory=dict)  # the transport's own settings, if it declares any
    weight_group_timeout_s: float = bounded(600.0, 1.0, SECONDS_MAX)  # joining the weight group, and each broadcast


@dataclass
class CreditConfig:
    method: str = "rredcot"  # a registered credit method (common.registry.CREDIT_METHODS) or a module path
    settings: dict[str, Any] = field(default_factory=dict)  # the method's own settings, if it declares any
    advantage_std_norm: bool = True
    segments: int = bounded(40, 1, COUNT_MAX)  # K
    min_segment_tokens: int = bounded(4, 1, COUNT_MAX)
    keywords: list[str] = field(
        default_factory=lambda: [
            "Wait",
            "But",
            "So",
            "Alternatively",
            "Hmm",
            "Let me",
            "Therefore",
            "Now",
            "Next",
            "Then",
            "Actually",
            "First",
            "Finally",
            "Thus",
            "However",
        ]
    )
    # the segmentation's four stages, each switchable (docs/credit.md, "The computation", step 3)
    split_keywords: bool = True  # a boundary before each new line and each keyword
    merge: bool = True  # merge the adjacent pieces of lowest total entropy
    stop_at_k: bool = True  # merging stops at K = segments pieces
    homogenise: bool = True  # re-place boundaries so that the largest segment entropy is minimal
    exit_string: str = "\n</think>\n\n"
    value_space: str = choice("log", "log", "prob", "mean_token_prob")
    sign: str = choice("relu", "relu", "abs", "softmax")
    softmax_temperature: float = bounded(1.0, 1e-6, 1e6)
    uniform_mix: float = bounded(0.0, 0.0, 1.0)  # lambda
    answer_part: str = choice("uniform", "uniform", "terminal")  # after the thinking span: docs/credit.md
    group_refs: bool = False  # add the group's correct completions as reference pairs
    # what a branch scores (docs/credit.md): the whole reference, the answer alone, or the reference's
    # remaining steps from each of its step boundaries, then the answer
    reference: str = choice("suffix", "solution", "answer", "suffix")
    # reference=suffix: step boundaries per reference pair (0 and |u| kept)
    max_suffixes: int = bounded(8, 2, COUNT_MAX)
    # group: less the other traces' values at the same relative segment position
    baseline: str = choice("group", "none", "group")
    max_refs: int = bounded(4, 1, COUNT_MAX)
    scorer: str = choice("reference", "reference", "policy")
    token_budget: int = bounded(8192, 64, COUNT_MAX)  # scorer batch size in tokens
    # peak of one exit-value forward (mask, scores, one layer's KV)
    values_memory_mb: int = bounded(1024, 1, BYTES_MAX // 2**20)
    branch_attention: str = choice("auto", "auto", "dense", "flex")  # flex: block-sparse, CUDA scorers
    entropy_chunk: int = bounded(1024, 16, COUNT_MAX)
    mc_samples: int = bounded(4, 1, COUNT_MAX)  # M, for method=mc
    # weighted groups (with a non-zero advantage) each worker saves for heatmaps
    save_traces: int = bounded(3, 0, COUNT_MAX)


@dataclass
class LearnerConfig:
    lr: float = bounded(1e-5, 0.0, 10.0)
    lr_warmup_steps: int = bounded(0, 0, COUNT_MAX)  # linear warm-up from lr/warmup to lr over this many steps
    # after the warm-up: constant, or cosine down to lr_min_ratio·lr at run.steps
    lr_schedule: str = choice("constant", "constant", "cosine")
    lr_min_ratio: float = bounded(0.1, 0.0, 1.0)
    weight_decay: float = bounded(0.0, 0.0, 10.0)
    eps_low: float = bounded(0.2, 0.0, 1.0)
    eps_high: float = bounded(0.28, 0.0, 10.0)
    tis_cap: float = bounded(2.0, 1.0, 1e6)  # truncated importance weight for staleness
    dual_clip: float = bounded(3.0, 0.0, 1e6)  # A < 0: the token objective is at least dual_clip·A; 0 = off
    kl_coef: float = bounded(0.0, 0.0, 1e6)
    loss_agg: str = choice("sample", "sample", "token")
    zero_stage: int = bounded(2, 0, 3)
    dtype: str = choice("auto", "auto", "float32", "bfloat16")  # auto: bf16 where native (common.precision)
    grad_checkpointing: bool = False
    offload: bool = False
    overlap_comm: bool = True  # ZeRO-2/3 on GPUs: overlap gradient reduction with the backward pass
    micro_token_budget: int = bounded(4096, 16, COUNT_MAX)  # tensor cells per micro-batch (packed: one row of samples)
    packing: str = choice("packed", "packed", "padded", "shared")  # shared: one prompt copy per group (4D mask)
    logprob_chunk: int = bounded(4096, 0, COUNT_MAX)  # LM-head chunk (tokens) for log-probs; 0 = all at once
    # float32 matrix products on CUDA (the LM head; all of them under dtype float32): TF32 tensor cores or IEEE
    fp32_matmul: str = choice("tf32", "tf32", "ieee")
    zero3_persistence_threshold: int = bounded(100000, 0, BYTES_MAX)  # ZeRO-3: params below this stay whole
    max_grad_norm: float = bounded(1.0, 0.0, 1e12)
    broadcast_every: int = bounded(1, 1, COUNT_MAX)
    checkpoint_every: int = bounded(0, 0, COUNT_MAX)  # steps; 0: by time only (and at the end)
    checkpoint_every_s: float = bounded(600.0, 0.0, SECONDS_MAX)  # wall seconds between checkpoints; 0: off
    keep_checkpoints: int = bounded(2, 1, COUNT_MAX)
    skip_zero_advantage: bool = True


@dataclass
class ClusterConfig:
    address: str | None = None  # Ray address; None starts Ray locally
    nodes: int = bounded(1, 1, NODES_MAX)
    generators: int = bounded(1, 1, NODES_MAX)
    redistributors: int = bounded(1, 1, NODES_MAX)
    learner_ranks: int = bounded(1, 1, NODES_MAX)
    gpus_per_generator: float = bounded(0.0, 0.0, NODES_MAX)
    gpus_per_redistributor: float = bounded(0.0, 0.0, NODES_MAX)
    gpus_per_learner: float = bounded(0.0, 0.0, NODES_MAX)
    # the evaluations' engine: a bundle of its own (with cpus_per_generator CPUs); 0: none, it runs
    # while the tiers wait, on the GPUs its node shows when the generators have GPUs (one shared GPU)
    gpus_per_evaluator: float = bounded("${cluster.gpus_per_generator}", 0.0, NODES_MAX)  # type: ignore[arg-type]
    cpus_per_generator: float = bounded(1.0, 0.0, NODES_MAX)
    cpus_per_redistributor: float = bounded(1.0, 0.0, NODES_MAX)
    cpus_per_learner: float = bounded(1.0, 0.0, NODES_MAX)
    placement: str = choice("pack", "pack", "spread")  # placement-group strategy across nodes
    # per generator / redistributor worker, and for the learner tier (reliability.md)
    max_restarts: int = bounded(3, 0, COUNT_MAX)
    dashboard: bool = False  # start Ray's dashboard with a local Ray (bound to dashboard_host)
    dashboard_host: str = "127.0.0.1"


@dataclass
class StalenessConfig:
    eta: int = bounded(1, 0, COUNT_MAX)


@dataclass
class RedisConfig:
    url: str | None = None  # redis:// or rediss://; None starts an embedded server
    password: str | None = None
    server: str = choice("auto", "auto", "valkey", "redis-server")
    port: int = bounded(0, 0, 65535)  # the embedded server's port; 0: a free one
    dir: str | None = None  # the embedded server's append-only file; None: <run.dir>/redis
    maxlen: int = bounded(256, 1, COUNT_MAX)  # stream bound (entries); producers block beyond it
    block_timeout_s: float = bounded(600.0, 0.0, SECONDS_MAX)
    claim_idle_ms: int = bounded(30000, 0, int(SECONDS_MAX * 1000))  # pending entries idle this long are reclaimed


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "rredcot"
    every: int = bounded(1, 1, COUNT_MAX)
    progress: bool = True
    # a plain progress line this often when stdout is no terminal
    progress_every_s: float = bounded(15.0, 0.5, SECONDS_MAX)
    eval_every: int = bounded(0, 0, COUNT_MAX)  # learner steps between held-out evaluations (0: start and end)


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


def resolve_config_path(path: str | Path) -> Path:
    """A config file path, or the name of a bundled config (``tests``, ``demo_cpu.yaml``): a bare
    name only, so that a path with a directory part that does not exist is an error, not a bundled
    config of the same file name."""
    p = Path(path)
    if p.is_file():
        return p
    bare = p.name == str(path)
    for candidate in (CONFIG_DIR / p.name, CONFIG_DIR / f"{p.name}.yaml"):
        if bare and candidate.is_file():
            return candidate
    raise ConfigError(f"config file {str(path)!r} not found (bundled configs: {available_configs()})")


def available_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Merge defaults, a YAML file and dotlist overrides; validate; return a typed ``Config``."""
    base = OmegaConf.structured(Config)
    layers: list[DictConfig] = []
    try:
        if path is not None:
            layers.append(_load_yaml(resolve_config_path(path)))
        if overrides:
            _check_overrides(overrides)
            layers.append(OmegaConf.from_dotlist(list(overrides)))
        for layer in layers:
            _check_shapes(OmegaConf.to_container(layer), Config)
        if overrides:
            _drop_settings_of_replaced_entries(layers)
        merged = OmegaConf.merge(base, *layers)
        OmegaConf.resolve(merged)
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e)) from None
    validate(cfg)
    return cfg


def _load_yaml(path: Path) -> DictConfig:
    """A config file as a mapping; YAML that does not parse, or a file that is no mapping, raises
    ``ConfigError`` with the file and line."""
    import yaml

    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config file {where}: not valid YAML ({problem})") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file {path}: expected a mapping of sections (run:, model:, ...), got a list")
    return loaded


def _check_overrides(overrides: list[str]) -> None:
    """Each override is ``key=value`` with a value (``key=`` would be null, typed ``None``)."""
    for o in overrides:
        key, eq, value = o.partition("=")
        if not eq:
            raise ConfigError(f"override {o!r} must look like key=value (e.g. learner.lr=1e-6)")
        if not value.strip():
            raise ConfigError(f"override {o!r} has no value (use {key}=null for null)")


def _check_shapes(values: dict[Any, Any], schema: type, prefix: str = "") -> None:
    """A section or a settings mapping given a scalar, a list or nothing, or a list given a mapping
    (``credit.keywords.0=x``), raises ``ConfigError`` naming the key (OmegaConf's merge names none)."""
    hints = typing.get_type_hints(schema)
    for name, value in values.items():
        key, hint = f"{prefix}{name}", hints.get(str(name))
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            _check_shapes(value, hint, key + ".")  # type: ignore[arg-type]
            continue
        if dataclasses.is_dataclass(hint):
            expected = f"a section: set {key}.<key>=… (e.g. {key}.{dataclasses.fields(hint)[0].name}=…)"
        elif typing.get_origin(hint) is dict and not isinstance(value, dict):
            expected = f"a mapping: set {key}.<key>=… or '{key}={{key: value}}'"
        elif typing.get_origin(hint) is list and isinstance(value, dict):
            expected = f"a whole list: set '{key}=[a,b]', not one item"
        else:
            continue
        raise ConfigError(f"{key} = {value!r} is not allowed; expected {expected}")


# (name key, settings key) of the config's extension points
_ENTRY_SETTINGS = (
    ("task", "name", "settings"),
    ("credit", "method", "settings"),
    ("generation", "weight_transport", "transport_settings"),
)


def _drop_settings_of_replaced_entries(layers: list[DictConfig]) -> None:
    """An override that switches ``task.name`` or ``credit.method`` drops the file's settings of the
    entry it replaces (they belong to the old one); settings given beside the switch still apply."""
    *earlier, last = layers
    for section, name, settings in _ENTRY_SETTINGS:
        new = OmegaConf.select(last, f"{section}.{name}")
        if new is None:
            continue
        for layer in earlier:
            if OmegaConf.select(layer, f"{section}.{name}") != new and OmegaConf.select(layer, section) is not None:
                layer[section].pop(settings, None)


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    msg = str(e).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        parent = ".".join(str(key).split(".")[:-1]) if key else ""
        allowed = _fields_at(parent)
        return f"unknown config key {key!r}; keys allowed under {parent or 'the top level'!r}: {allowed}"
    return f"invalid config value for {key!r}: {msg}" if key else f"invalid config: {msg}"


def _fields_at(dotted: str) -> list[str]:
    node: Any = Config()
    for part in filter(None, dotted.split(".")):
        node = getattr(node, part, None)
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []


def validate(cfg: Config) -> None:
    """Check every declared choice and range, the extension names and settings, then the cross-field
    rules."""
    _validate_fields(cfg, "")
    try:
        _validate_extensions(cfg)
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    _check(
        cfg.generation.max_tokens < cfg.model.max_model_len,
        "generation.max_tokens",
        cfg.generation.max_tokens,
        f"< model.max_model_len ({cfg.model.max_model_len})",
    )
    _check(
        cfg.generation.overlong_window < cfg.generation.max_tokens,
        "generation.overlong_window",
        cfg.generation.overlong_window,
        f"< generation.max_tokens ({cfg.generation.max_tokens}): the penalty ramps over the budget's last tokens",
    )
    _check(
        cfg.learner.micro_token_budget >= cfg.model.max_model_len,
        "learner.micro_token_budget",
        cfg.learner.micro_token_budget,
        f">= model.max_model_len ({cfg.model.max_model_len}) so that the longest sample fits one micro-batch",
    )
    _check(
        cfg.generation.temperature > 0,
        "generation.temperature",
        cfg.generation.temperature,
        "> 0: a group of samples needs sampling (vLLM refuses greedy decoding with n > 1)",
    )
    _check(
        cfg.generation.top_p == 1.0,
        "generation.top_p",
        cfg.generation.top_p,
        "1.0: the learner's importance ratio does not model top-p truncation, so any other value biases "
        "every ratio from the first step",
    )
    _check(
        not cfg.logging.wandb or importlib.util.find_spec("wandb") is not None,
        "logging.wandb",
        cfg.logging.wandb,
        "false, or install the wandb package first (pip install wandb)",
    )
    _check(
        RUN_NAME.fullmatch(cfg.run.name) is not None,
        "run.name",
        cfg.run.name,
        "letters, digits, '-', '_' and '.' (not first), at most 64: it names the run's directory and Redis keys",
    )
    url_problem = None if cfg.redis.url is None else redis_url_problem(cfg.redis.url)
    _check(
        url_problem is None,
        "redis.url",
        redact_url(cfg.redis.url),
        "redis://[:password@]host[:port][/db], rediss://… (TLS) or unix:///path/to/socket, or null for an "
        f"embedded server; this one {url_problem}",
    )
    _check(
        cfg.redis.password is None or (cfg.redis.password != "" and cfg.redis.password.isprintable()),
        "redis.password",
        "***",
        "null (the embedded server makes a random one) or a non-empty string of printable characters",
    )
    _check(
        cfg.credit.exit_string != "",
        "credit.exit_string",
        cfg.credit.exit_string,
        "a non-empty string (the text that ends the thinking span early; it must tokenise to >= 1 token)",
    )
    m = cfg.model
    for key, tag in (("model.think_start", m.think_start), ("model.think_end", m.think_end)):
        _check(tag != "", key, tag, "a non-empty string (the tag that opens or closes the thinking span)")
    _check(
        m.think_end != m.think_start,
        "model.think_end",
        m.think_end,
        f"a tag other than model.think_start ({m.think_start!r}): the thinking span lies between the two",
    )
    _check(
        "" not in cfg.generation.stop,
        "generation.stop",
        cfg.generation.stop,
        "a list of non-empty strings (vLLM refuses an empty stop string)",
    )
    _check(
        cfg.redis.maxlen >= cfg.generation.prompts_per_step,
        "redis.maxlen",
        cfg.redis.maxlen,
        f">= generation.prompts_per_step ({cfg.generation.prompts_per_step}) at the least: the learner keeps "
        "a step's batches entries (and any re-sent copies it reads) unacknowledged until the step ends, so the "
        "stream must hold a whole step and some room",
    )
    _check(cfg.learner.eps_low < 1.0, "learner.eps_low", cfg.learner.eps_low, "a value in [0, 1)")
    c = cfg.cluster
    for tier in ("generator", "redistributor", "learner"):
        cpus, gpus = getattr(c, f"cpus_per_{tier}"), getattr(c, f"gpus_per_{tier}")
        _check(
            cpus > 0 or gpus > 0,
            f"cluster.cpus_per_{tier}",
            cpus,
            f"a number > 0 while cluster.gpus_per_{tier} is 0 (Ray cannot place a worker that asks for nothing)",
        )
    for tier in ("generator", "redistributor", "learner", "evaluator"):
        gpus = getattr(c, f"gpus_per_{tier}")
        _check(
            gpus <= 1 or gpus == int(gpus),
            f"cluster.gpus_per_{tier}",
            gpus,
            "a fraction of one GPU (<= 1) or a whole number of GPUs",
        )
    _check(
        cfg.credit.branch_attention != "flex" or c.gpus_per_redistributor > 0,
        "credit.branch_attention",
        cfg.credit.branch_attention,
        "'auto' or 'dense' while cluster.gpus_per_redistributor is 0 (flex attention needs a CUDA scorer)",
    )
    _check(
        cfg.learner.kl_coef == 0 or cfg.learner.zero_stage < 3,
        "learner.kl_coef",
        cfg.learner.kl_coef,
        "0 with learner.zero_stage=3 (the KL reference model is a whole copy; use zero_stage 0-2 for a KL term)",
    )
    _check(
        cfg.learner.dual_clip == 0 or cfg.learner.dual_clip > 1 + cfg.learner.eps_high,
        "learner.dual_clip",
        cfg.learner.dual_clip,
        "0 (off) or a value above 1 + learner.eps_high",
    )
    method = cfg.credit.method
    _check(
        method != "bnpo" or cfg.learner.loss_agg == "token",
        "learner.loss_agg",
        cfg.learner.loss_agg,
        "'token' with credit.method=bnpo (BNPO is the token mean over the batch)",
    )
    _check(
        method != "drgrpo" or cfg.learner.loss_agg == "sample",
        "learner.loss_agg",
        cfg.learner.loss_agg,
        "'sample' with credit.method=drgrpo (Dr. GRPO divides each sample by the constant max_tokens)",
    )
    _check(
        method != "drgrpo" or not cfg.credit.advantage_std_norm,
        "credit.advantage_std_norm",
        cfg.credit.advantage_std_norm,
        "false with credit.method=drgrpo (Dr. GRPO does not divide advantages by their std)",
    )
    _check(
        cfg.credit.answer_part != "terminal" or method != "rredcot" or cfg.credit.value_space != "log",
        "credit.value_space",
        cfg.credit.value_space,
        "'prob' or 'mean_token_prob' with credit.answer_part=terminal (the outcome R is a probability; "
        "log R is -inf for a wrong answer)",
    )


RUN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")


def redis_url_problem(url: str) -> str | None:
    """What is wrong with a ``redis.url`` (scheme, host, port, db or socket path), or None."""
    try:
        parts = urlsplit(url)
        port, db = parts.port, parts.path.strip("/")
    except ValueError as e:
        return f"does not parse ({e})"
    if parts.scheme == "unix":
        return None if parts.path else "has no socket path"
    if parts.scheme not in ("redis", "rediss"):
        return f"has the scheme {parts.scheme!r}" if parts.scheme else "has no scheme"
    if not parts.hostname:
        return "has no host"
    if port == 0:
        return "has port 0"
    return None if db == "" or db.isdigit() else f"has the database {db!r}, not a number"


def _validate_extensions(cfg: Config) -> None:
    """The task, credit method and weight transport exist; their own settings are valid."""
    from rredcot.common.task import build_task

    task = build_task(cfg.task)
    if task.settings is not None:
        _validate_fields(task.settings, "task.settings.")
    _check(
        bool(cfg.data.path) == task.reads_dataset,
        "data.path",
        cfg.data.path,
        f"a file or dataset path for task {cfg.task.name!r}"
        if task.reads_dataset
        else f"null: task {cfg.task.name!r} generates its problems",
    )
    task.check(cfg)
    for registry, name, settings, settings_key in (
        (CREDIT_METHODS, cfg.credit.method, cfg.credit.settings, "credit.settings"),
        (
            WEIGHT_TRANSPORTS,
            cfg.generation.weight_transport,
            cfg.generation.transport_settings,
            "generation.transport_settings",
        ),
    ):
        if registry.is_builtin(name) and not settings:
            continue  # a built-in without settings: no need to import its stage to check it
        entry = registry.get(name)
        owner = f"{registry.kind} {name!r}"
        typed = typed_settings(getattr(entry, "settings", None), dict(settings), settings_key, owner)
        if typed is not None:
            _validate_fields(typed, settings_key + ".")
            if hasattr(typed, "check"):  # settings that depend on the rest of the config
                typed.check(cfg)
    _check_cpu_kv_blocks(cfg)


def tensor_parallel(gpus: float) -> int:
    """The tensor-parallel size of a vLLM engine on ``gpus`` GPUs: one engine over all of them
    (1 for a share of one GPU, or none)."""
    return max(1, int(gpus))


def engine_gpus(cfg: Config) -> dict[str, float]:
    """GPUs per worker of each tier that runs a vLLM engine: the generators, and the redistributors
    when the credit method samples continuations (its module is imported here)."""
    c = cfg.cluster
    tiers = {"generator": c.gpus_per_generator}
    if CREDIT_METHODS.get(cfg.credit.method).needs_sampler:
        tiers["redistributor"] = c.gpus_per_redistributor
    return tiers


def _check_cpu_kv_blocks(cfg: Config) -> None:
    """vLLM-CPU takes KV blocks of a multiple of 32: the generators' engines, and the MC engine of a
    credit method that samples continuations on a redistributor without a GPU."""
    size = cfg.generation.kv_block_size
    if size % 32 == 0:  # the credit method's module is imported only when it matters
        return
    _check(
        all(engine_gpus(cfg).values()),
        "generation.kv_block_size",
        size,
        "0 (auto) or a multiple of 32 while a vLLM engine runs on a CPU (cluster.gpus_per_generator is 0, or "
        "the credit method samples continuations and cluster.gpus_per_redistributor is 0)",
    )


def _validate_fields(node: Any, prefix: str) -> None:
    for f in dataclasses.fields(node):
        key = f"{prefix}{f.name}"
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            _validate_fields(value, key + ".")
            continue
        choices = f.metadata.get("choices")
        if choices is not None:
            _check(value in choices, key, value, "one of " + ", ".join(map(repr, choices)))
        bounds = f.metadata.get("range")
        if bounds is not None:
            lo, hi = bounds
            lo_open = f.metadata.get("lo_open", False)
            finite = isinstance(value, int) or isinstance(value, float) and math.isfinite(value)
            ok = finite and (lo is None or (value > lo if lo_open else value >= lo)) and (hi is None or value <= hi)
            _check(ok, key, value, _range_text(lo, hi, lo_open, "a number" if finite else "a finite number"))


def _range_text(lo: float | None, hi: float | None, lo_open: bool = False, noun: str = "a number") -> str:
    if lo is not None and hi is not None:
        return f"{noun} in {'(' if lo_open else '['}{lo}, {hi}]"
    if lo is not None:
        return f"{noun} {'>' if lo_open else '>='} {lo}"
    return f"{noun} <= {hi}"


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r} is not allowed; expected {allowed}")


def redacted(cfg: Config) -> Config:
    """The config without secrets (Redis password, and the password inside ``redis.url``)."""
    return dataclasses.replace(
        cfg,
        redis=dataclasses.replace(
            cfg.redis, url=redact_url(cfg.redis.url), password="***" if cfg.redis.password else None
        ),
    )


def redact_url(url: str | None) -> str | None:
    """``url`` with the password (``scheme://user:password@``) replaced by ``***``."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url) if url else url


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict (for crossing process boundaries as msgpack/JSON, never pickle)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def from_dict(d: dict[str, Any]) -> Config:
    cfg: Config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), d))  # type: ignore
    validate(cfg)
    return cfg
