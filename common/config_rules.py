"""Validation of a run configuration: every declared choice and range, the extensions' names and
settings, then the rules between keys; a broken rule raises ``ConfigError`` naming the key, its value
and what is allowed."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from typing import Any
from urllib.parse import urlsplit

from rredcot.common.config_schema import Config, ConfigError
from rredcot.common.registry import CREDIT_METHODS, WEIGHT_TRANSPORTS, RegistryError, make_task, typed_settings


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


def redact_url(url: str | None) -> str | None:
    """``url`` with the password (``scheme://user:password@``) replaced by ``***``."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url) if url else url


def _validate_extensions(cfg: Config) -> None:
    """The task, credit method and weight transport exist; their own settings are valid."""
    task = make_task(cfg.task.name, cfg.task.settings)
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
