"""Validation of a run configuration: every declared choice and range, the extensions' names and
settings, then the rules between keys (the credit method's own: its ``check``); a broken rule raises
``ConfigError`` naming the key, its value and what is allowed."""

from __future__ import annotations

import importlib.util
import re
from urllib.parse import urlsplit

from rredcot.common.config_fields import require, validate_fields
from rredcot.common.config_schema import Config, ConfigError
from rredcot.common.credit_spec import CreditSpec, resolve_credit, settings_blocks
from rredcot.common.registry import WEIGHT_TRANSPORTS, RegistryError, make_task, typed_settings


def validate(cfg: Config) -> None:
    """Check every declared choice and range, the extension names and settings, then the cross-field
    rules."""
    validate_fields(cfg, "")
    try:
        credit = _validate_extensions(cfg)
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    require(
        cfg.generation.max_tokens < cfg.model.max_model_len,
        "generation.max_tokens",
        cfg.generation.max_tokens,
        f"< model.max_model_len ({cfg.model.max_model_len})",
    )
    require(
        cfg.generation.overlong_window < cfg.generation.max_tokens,
        "generation.overlong_window",
        cfg.generation.overlong_window,
        f"< generation.max_tokens ({cfg.generation.max_tokens}): the penalty ramps over the budget's last tokens",
    )
    require(
        cfg.learner.micro_token_budget >= cfg.model.max_model_len,
        "learner.micro_token_budget",
        cfg.learner.micro_token_budget,
        f">= model.max_model_len ({cfg.model.max_model_len}) so that the longest sample fits one micro-batch",
    )
    require(
        cfg.generation.temperature > 0,
        "generation.temperature",
        cfg.generation.temperature,
        "> 0: a group of samples needs sampling (vLLM refuses greedy decoding with n > 1)",
    )
    require(
        cfg.generation.top_p == 1.0,
        "generation.top_p",
        cfg.generation.top_p,
        "1.0: the learner's importance ratio does not model top-p truncation, so any other value biases "
        "every ratio from the first step",
    )
    require(
        not cfg.logging.wandb or importlib.util.find_spec("wandb") is not None,
        "logging.wandb",
        cfg.logging.wandb,
        "false, or install the wandb package first (pip install wandb)",
    )
    require(
        RUN_NAME.fullmatch(cfg.run.name) is not None,
        "run.name",
        cfg.run.name,
        "letters, digits, '-', '_' and '.' (not first), at most 64: it names the run's directory and Redis keys",
    )
    url_problem = None if cfg.redis.url is None else redis_url_problem(cfg.redis.url)
    require(
        url_problem is None,
        "redis.url",
        redact_url(cfg.redis.url),
        "redis://[:password@]host[:port][/db], rediss://… (TLS) or unix:///path/to/socket, or null for an "
        f"embedded server; this one {url_problem}",
    )
    address_problem = None if cfg.cluster.address is None else cluster_address_problem(cfg.cluster.address)
    require(
        address_problem is None,
        "cluster.address",
        cfg.cluster.address,
        f"null (a local Ray), auto (the Ray on this node), host:port or ray://host[:port]; this one {address_problem}",
    )
    require(
        cfg.redis.password is None or (cfg.redis.password != "" and cfg.redis.password.isprintable()),
        "redis.password",
        "***",
        "null (the embedded server makes a random one) or a non-empty string of printable characters",
    )
    require(
        cfg.credit.scorer.exit_string != "",
        "credit.scorer.exit_string",
        cfg.credit.scorer.exit_string,
        "a non-empty string (the text that ends the thinking span early; it must tokenise to >= 1 token)",
    )
    m = cfg.model
    for key, tag in (("model.think_start", m.think_start), ("model.think_end", m.think_end)):
        require(tag != "", key, tag, "a non-empty string (the tag that opens or closes the thinking span)")
    require(
        m.think_end != m.think_start,
        "model.think_end",
        m.think_end,
        f"a tag other than model.think_start ({m.think_start!r}): the thinking span lies between the two",
    )
    require(
        "" not in cfg.generation.stop,
        "generation.stop",
        cfg.generation.stop,
        "a list of non-empty strings (vLLM refuses an empty stop string)",
    )
    require(
        cfg.redis.maxlen >= cfg.generation.prompts_per_step,
        "redis.maxlen",
        cfg.redis.maxlen,
        f">= generation.prompts_per_step ({cfg.generation.prompts_per_step}) at the least: the learner keeps "
        "a step's batches entries (and any re-sent copies it reads) unacknowledged until the step ends, so the "
        "stream must hold a whole step and some room",
    )
    require(cfg.learner.eps_low < 1.0, "learner.eps_low", cfg.learner.eps_low, "a value in [0, 1)")
    c = cfg.cluster
    for tier in ("generator", "redistributor", "learner"):
        cpus, gpus = getattr(c, f"cpus_per_{tier}"), getattr(c, f"gpus_per_{tier}")
        require(
            cpus > 0 or gpus > 0,
            f"cluster.cpus_per_{tier}",
            cpus,
            f"a number > 0 while cluster.gpus_per_{tier} is 0 (Ray cannot place a worker that asks for nothing)",
        )
    for tier in ("generator", "redistributor", "learner", "evaluator"):
        gpus = getattr(c, f"gpus_per_{tier}")
        require(
            gpus <= 1 or gpus == int(gpus),
            f"cluster.gpus_per_{tier}",
            gpus,
            "a fraction of one GPU (<= 1) or a whole number of GPUs",
        )
    require(
        cfg.credit.scorer.branch_attention != "flex" or c.gpus_per_redistributor > 0,
        "credit.scorer.branch_attention",
        cfg.credit.scorer.branch_attention,
        "'auto' or 'dense' while cluster.gpus_per_redistributor is 0 (flex attention needs a CUDA scorer)",
    )
    require(
        cfg.learner.kl_coef == 0 or cfg.learner.zero_stage < 3,
        "learner.kl_coef",
        cfg.learner.kl_coef,
        "0 with learner.zero_stage=3 (the KL reference model is a whole copy; use zero_stage 0-2 for a KL term)",
    )
    require(
        cfg.learner.dual_clip == 0 or cfg.learner.dual_clip > 1 + cfg.learner.eps_high,
        "learner.dual_clip",
        cfg.learner.dual_clip,
        "0 (off) or a value above 1 + learner.eps_high",
    )
    _check_cpu_kv_blocks(cfg, credit)
    if credit.method.check is not None:  # the credit method's rules between keys (redistributor.methods)
        credit.method.check(cfg, credit.settings)


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


def cluster_address_problem(address: str) -> str | None:
    """What is wrong with a ``cluster.address`` (its host or port), or None."""
    if address == "auto":
        return None
    where = address.removeprefix("ray://")
    host, colon, port = where.rpartition(":") if ":" in where else (where, "", "")
    if not host.strip("[]"):
        return "has no host"
    if colon and not (port.isdigit() and 1 <= int(port) <= 65535):
        return f"has the port {port!r}, not a number in [1, 65535]"
    return None


def redact_url(url: str | None) -> str | None:
    """``url`` with the password (``scheme://user:password@``) replaced by ``***``."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url) if url else url


def _validate_extensions(cfg: Config) -> CreditSpec:
    """The task, credit method and weight transport exist; their own settings are valid (every block
    of ``credit.settings``, whichever method runs); returns the credit method resolved."""
    task = make_task(cfg.task.name, cfg.task.settings)
    if task.settings is not None:
        validate_fields(task.settings, "task.settings.")
    require(
        bool(cfg.data.path) == task.reads_dataset,
        "data.path",
        cfg.data.path,
        f"a file or dataset path for task {cfg.task.name!r}"
        if task.reads_dataset
        else f"null: task {cfg.task.name!r} generates its problems",
    )
    task.check(cfg)
    credit = resolve_credit(cfg)
    for name, typed in settings_blocks(cfg).items():
        if typed is not None:
            validate_fields(typed, f"credit.settings.{name}.")
    name = cfg.generation.weight_transport
    settings = cfg.generation.transport_settings
    if not WEIGHT_TRANSPORTS.is_builtin(name) or settings:  # a built-in without settings: nothing to import
        entry = WEIGHT_TRANSPORTS.get(name)
        owner = f"{WEIGHT_TRANSPORTS.kind} {name!r}"
        typed = typed_settings(entry.settings, dict(settings), "generation.transport_settings", owner)
        if typed is not None:
            validate_fields(typed, "generation.transport_settings.")
            if hasattr(typed, "check"):  # settings that depend on the rest of the config
                typed.check(cfg)
    return credit


def tensor_parallel(gpus: float) -> int:
    """The tensor-parallel size of a vLLM engine on ``gpus`` GPUs: one engine over all of them
    (1 for a share of one GPU, or none)."""
    return max(1, int(gpus))


def engine_gpus(cfg: Config, credit: CreditSpec | None = None) -> dict[str, float]:
    """GPUs per worker of each tier that runs a vLLM engine: the generators, and the redistributors
    when the credit method samples continuations (``credit``: resolved by the caller, else here)."""
    c = cfg.cluster
    tiers = {"generator": c.gpus_per_generator}
    if (credit or resolve_credit(cfg)).prover is not None:  # it samples continuations
        tiers["redistributor"] = c.gpus_per_redistributor
    return tiers


def _check_cpu_kv_blocks(cfg: Config, credit: CreditSpec) -> None:
    """vLLM-CPU takes KV blocks of a multiple of 32: the generators' engines, and the MC engine of a
    credit method that samples continuations on a redistributor without a GPU."""
    size = cfg.generation.kv_block_size
    if size % 32 == 0:
        return
    require(
        all(engine_gpus(cfg, credit).values()),
        "generation.kv_block_size",
        size,
        "0 (auto) or a multiple of 32 while a vLLM engine runs on a CPU (cluster.gpus_per_generator is 0, or "
        "the credit method samples continuations and cluster.gpus_per_redistributor is 0)",
    )
