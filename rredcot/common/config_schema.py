"""The run configuration's schema: every key with its default, and its range (``bounded``) or its
allowed values (``choice``), in one file that docs/config.md mirrors key for key. The rules between
keys: ``config_rules``; loading and serialising: ``config``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rredcot.common.errors import UserError

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
    about: str = ""  # one line on what the run trains and why: its first log line and its report's


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
    # 0: train on every problem not held out; N: on the first N of them only (a small pool, revisited)
    train_size: int = bounded(0, 0, COUNT_MAX)
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
    # a problem whose group came back all correct this many times in a row is not generated again this
    # run (rredcot/actors/retirement.py: its admissions are rejected before the engine sees them); 0: off
    retire_solved: int = bounded(0, 0, COUNT_MAX)
    # completions cut at max_tokens (rredcot/common/overlong.py): none; penalty, a reward ramping to -1 over the
    # last overlong_window tokens (DAPO's soft punishment); filter, no advantage for a truncated sample
    overlong: str = choice("none", "none", "penalty", "filter")
    overlong_window: int = bounded(0, 0, COUNT_MAX)  # tokens; 0: max_tokens // 4
    idle_poll_s: float = bounded(0.05, 0.001, SECONDS_MAX)  # wait between admission retries while staleness blocks
    weight_transport: str = "file"  # a registered transport (file, collective, ipc: transports) or a module path
    transport_settings: dict[str, Any] = field(default_factory=dict)  # the transport's own settings, if it declares any
    weight_group_timeout_s: float = bounded(600.0, 1.0, SECONDS_MAX)  # joining the weight group, and each broadcast


@dataclass
class SegmentationConfig:
    """``credit.segmentation``: the thinking span's segments, for every method that segments it
    (docs/credit.md, "The computation", step 3; each stage switchable)."""

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
    split_keywords: bool = True  # a boundary before each new line and each keyword
    merge: bool = True  # merge the adjacent pieces of lowest total entropy
    stop_at_k: bool = True  # merging stops at K = segments pieces
    homogenise: bool = True  # re-place boundaries so that the largest segment entropy is minimal


@dataclass
class ScorerConfig:
    """``credit.scorer``: the scorer model, for every method that runs it (entropies, branches)."""

    model: str = choice("reference", "reference", "policy")  # model.path's weights, or the policy's
    exit_string: str = "\n</think>\n\n"  # what ends the thinking span early in a branch
    token_budget: int = bounded(8192, 64, COUNT_MAX)  # scorer batch size in tokens
    # peak of one exit-value forward (mask, scores, one layer's KV)
    values_memory_mb: int = bounded(1024, 1, BYTES_MAX // 2**20)
    branch_attention: str = choice("auto", "auto", "dense", "flex")  # flex: block-sparse, CUDA scorers
    entropy_chunk: int = bounded(1024, 16, COUNT_MAX)


@dataclass
class CreditConfig:
    method: str = "rredcot"  # a registered credit method (common.registry.CREDIT_METHODS) or a module path
    advantage_std_norm: bool = True
    # weighted groups (with a non-zero advantage) each worker saves for heatmaps
    save_traces: int = bounded(3, 0, COUNT_MAX)
    segmentation: SegmentationConfig = field(default_factory=SegmentationConfig)
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    # each method's own settings keyed by its name (credit.settings.rredcot.uniform_mix): every block is
    # checked against its method's settings dataclass, only credit.method's is used (common.credit_spec)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)


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
    # every evaluation also measures the first N training problems: how well the policy fits what it trains on
    eval_train: int = bounded(0, 0, COUNT_MAX)
    # the evaluator's vLLM KV cache (0: generation.kv_cache_bytes): room for the whole evaluation at once
    # is fewer, wider decoding steps (benchmarks.md)
    eval_kv_cache_bytes: int = bounded(0, 0, BYTES_MAX)
    # each held-out problem's samples from a seed of its own, the same in every evaluation (common random
    # numbers): a paired change then measures training, not the draw (benchmarks.md)
    eval_same_draws: bool = False


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
