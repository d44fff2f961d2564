"""Run configuration: loading (defaults, a YAML file, dotlist overrides), validation and
serialisation; the one module the stages import for it. The schema (every key, its default and
range) is ``config_schema``, the rules between keys ``config_rules``; both are re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rredcot.common.config_fields import require
from rredcot.common.config_rules import (
    RUN_NAME,
    engine_gpus,
    redact_url,
    redis_url_problem,
    tensor_parallel,
    validate,
)
from rredcot.common.config_schema import (
    BYTES_MAX,
    COUNT_MAX,
    NODES_MAX,
    PROBLEMS_MAX,
    SECONDS_MAX,
    SEED_MAX,
    ClusterConfig,
    Config,
    ConfigError,
    CreditConfig,
    DataConfig,
    GenerationConfig,
    LearnerConfig,
    LoggingConfig,
    ModelConfig,
    RedisConfig,
    RunConfig,
    ScorerConfig,
    SegmentationConfig,
    StalenessConfig,
    TaskConfig,
    bounded,
    choice,
)
from rredcot.common.credit_spec import CreditSpec, resolve_credit

__all__ = [
    "BYTES_MAX",
    "COUNT_MAX",
    "MOVED_KEYS",
    "NODES_MAX",
    "PROBLEMS_MAX",
    "RUN_NAME",
    "SECONDS_MAX",
    "SEED_MAX",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "CreditConfig",
    "CreditSpec",
    "DataConfig",
    "GenerationConfig",
    "LearnerConfig",
    "LoggingConfig",
    "ModelConfig",
    "RedisConfig",
    "RunConfig",
    "ScorerConfig",
    "SegmentationConfig",
    "StalenessConfig",
    "TaskConfig",
    "available_configs",
    "bounded",
    "choice",
    "engine_gpus",
    "from_dict",
    "load_config",
    "redact_url",
    "redacted",
    "redis_url_problem",
    "require",
    "resolve_credit",
    "tensor_parallel",
    "to_dict",
    "to_yaml",
    "validate",
]

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


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


@functools.cache
def _schema() -> DictConfig:
    """The defaults as OmegaConf's typed tree, built once a process (17 ms each time, 43% of a
    ``load_config``); a merge copies it, never changes it."""
    return OmegaConf.structured(Config)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Merge defaults, a YAML file and dotlist overrides; validate; return a typed ``Config``."""
    base = _schema()
    layers: list[DictConfig] = []
    sources: list[str] = []  # where each layer comes from, for the errors
    try:
        if path is not None:
            file = resolve_config_path(path)
            layers.append(_load_yaml(file))
            sources.append(f"config file {file}: ")
        if overrides:
            _check_overrides(overrides)
            layers.append(OmegaConf.from_dotlist(_literal_if_not_yaml(overrides)))
            sources.append("override ")
        for layer, source in zip(layers, sources, strict=True):
            values = OmegaConf.to_container(layer)
            _check_moved(values, source)  # type: ignore[arg-type]
            _check_shapes(values, Config)  # type: ignore[arg-type]
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


def _literal_if_not_yaml(overrides: list[str]) -> list[str]:
    """Overrides whose value YAML cannot read (``run.name=*``, an alias without its anchor) with the
    value as the literal string, so that the key's own check names it (it was a raw ``ScannerError``)."""
    import json

    import yaml
    from omegaconf._yaml import get_yaml_loader

    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        try:
            yaml.load(value, Loader=get_yaml_loader())
        except yaml.YAMLError:
            o = f"{key}={json.dumps(value)}"
        out.append(o)
    return out


def _check_shapes(values: dict[Any, Any], schema: type, prefix: str = "") -> None:
    """A section or a settings mapping given a scalar, a list or nothing, or a list given a mapping
    (``credit.segmentation.keywords.0=x``), raises ``ConfigError`` naming the key (OmegaConf's merge names none)."""
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
        elif typing.get_args(hint)[1:] and typing.get_origin(typing.get_args(hint)[1]) is dict:
            # a mapping of blocks (credit.settings: one per method) given something else as a block
            block = next((k for k, v in value.items() if not isinstance(v, dict)), None)
            if block is None:
                continue
            expected = f"a block of settings: {key} holds one per method, set {key}.<method>.{block}=…"
            key, value = f"{key}.{block}", value[block]
        else:
            continue
        raise ConfigError(f"{key} = {value!r} is not allowed; expected {expected}")


_SEGMENTATION = ("segments", "min_segment_tokens", "keywords", "split_keywords", "merge", "stop_at_k", "homogenise")
_SCORER = ("exit_string", "token_budget", "values_memory_mb", "branch_attention", "entropy_chunk")
_VALUES = ("value_space", "sign", "softmax_temperature", "uniform_mix")  # rredcot's and mc's
_RREDCOT = ("group_refs", "reference", "max_suffixes", "baseline", "max_refs")
# the credit keys that moved (issue 40): old key -> its new home, named in the error that refuses it
MOVED_KEYS = (
    {f"credit.{k}": f"credit.segmentation.{k}" for k in _SEGMENTATION}
    | {f"credit.{k}": f"credit.scorer.{k}" for k in _SCORER}
    | {"credit.scorer": "credit.scorer.model"}
    | {f"credit.{k}": f"credit.settings.rredcot.{k} (method mc: credit.settings.mc.{k})" for k in _VALUES}
    | {"credit.answer_part": "credit.settings.<method>.answer_part (method rredcot, mc or progress)"}
    | {f"credit.{k}": f"credit.settings.rredcot.{k}" for k in _RREDCOT}
    | {"credit.mc_samples": "credit.settings.mc.samples"}
)


def _check_moved(values: dict[str, Any], source: str = "") -> None:
    """A key that moved (``MOVED_KEYS``: ``credit.uniform_mix``, the string ``credit.scorer``)
    raises ``ConfigError`` naming its new home (``source``: where it was set)."""
    credit = values.get("credit")
    for name, value in credit.items() if isinstance(credit, dict) else ():
        key = f"credit.{name}"
        if key in MOVED_KEYS and not (name == "scorer" and isinstance(value, dict)):
            raise ConfigError(f"{source}{key} has moved: set {MOVED_KEYS[key]} instead (docs/config.md, credit)")


# (name key, settings key) of the config's extension points whose settings belong to one entry
# (credit.settings is keyed by method: a switch of credit.method keeps it)
_ENTRY_SETTINGS = (
    ("task", "name", "settings"),
    ("generation", "weight_transport", "transport_settings"),
)


def _drop_settings_of_replaced_entries(layers: list[DictConfig]) -> None:
    """An override that switches ``task.name`` or ``generation.weight_transport`` drops the file's
    settings of the entry it replaces (they belong to the old one); settings given beside the switch
    still apply."""
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


def redacted(cfg: Config) -> Config:
    """The config without secrets (Redis password, and the password inside ``redis.url``)."""
    return dataclasses.replace(
        cfg,
        redis=dataclasses.replace(
            cfg.redis, url=redact_url(cfg.redis.url), password="***" if cfg.redis.password else None
        ),
    )


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict (for crossing process boundaries as msgpack/JSON, never pickle)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def from_dict(d: dict[str, Any]) -> Config:
    cfg: Config = OmegaConf.to_object(OmegaConf.merge(_schema(), d))  # type: ignore
    validate(cfg)
    return cfg
