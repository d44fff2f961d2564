"""``credit.method`` resolved once: its registered entry, its typed settings (its block of
``credit.settings``, keyed by method name) and the continuations it samples (its prover). The config
checks, launch and the redistributor take a ``CreditSpec`` rather than looking the method up again.
The entries are registered by light modules (``redistributor.methods``: no torch), so resolving one
is cheap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rredcot.common.config_schema import Config, ConfigError
from rredcot.common.registry import CREDIT_METHODS, typed_settings

SETTINGS_KEY = "credit.settings"


@dataclass(frozen=True)
class CreditSpec:
    """What a run's credit method is and needs."""

    method: Any  # the registered entry (``redistributor.registry.CreditMethod``)
    settings: Any  # its settings dataclass, filled from its block; None when it declares none
    prover: str | None  # whose continuations it samples: "policy", "initial" or a model path; None: none
    settings_key: str  # its block: credit.settings.<name>


def resolve_credit(cfg: Config) -> CreditSpec:
    """``credit.method``'s entry, its settings from its block (the defaults without one) and its
    prover. Its block is keyed by the method's name as configured, or by the name its module
    registered (``tests.extensions.last_token``: ``last_token``, the key a dotted override can set);
    a method that takes another's settings (``settings_of``: ``shuffled``) reads that method's block."""
    method = CREDIT_METHODS.get(cfg.credit.method)
    owner = CREDIT_METHODS.get(method.settings_of) if method.settings_of else method
    names = (owner.name,) if method.settings_of else (cfg.credit.method, method.name)
    keys = [k for k in dict.fromkeys(names) if k in cfg.credit.settings]
    if len(keys) > 1:
        raise ConfigError(
            f"{SETTINGS_KEY}.{keys[0]} and {SETTINGS_KEY}.{keys[1]} are not allowed together: both are "
            f"the settings of credit method {method.name!r}; keep one"
        )
    key = f"{SETTINGS_KEY}.{keys[0] if keys else owner.name}"
    block = dict(cfg.credit.settings.get(keys[0], {})) if keys else {}
    settings = typed_settings(owner.settings, block, key, f"credit method {cfg.credit.method!r}")
    return CreditSpec(method, settings, None if method.prover is None else method.prover(settings), key)


def settings_blocks(cfg: Config) -> dict[str, Any]:
    """Every block of ``credit.settings`` as its method's typed settings, by key, whichever method
    the run uses. A block of no method, an unknown key or a wrong value raises ``RegistryError``
    naming ``credit.settings.<name>[.<key>]``; so does a block of a method that takes another's settings."""
    out = {}
    for name, block in cfg.credit.settings.items():
        where = f"{SETTINGS_KEY}.{name} (settings are keyed by credit method: {SETTINGS_KEY}.<method>.<key>)"
        method = CREDIT_METHODS.get(name, where)
        if method.settings_of:
            raise ConfigError(
                f"{SETTINGS_KEY}.{name} is not allowed: credit method {name!r} takes the settings of "
                f"{method.settings_of!r}; set them under {SETTINGS_KEY}.{method.settings_of}"
            )
        out[name] = typed_settings(method.settings, dict(block), f"{SETTINGS_KEY}.{name}", f"credit method {name!r}")
    return out
