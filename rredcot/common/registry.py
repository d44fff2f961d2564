"""Named extension points: tasks, credit methods, weight transports and builtin models.

A registry maps a name to an entry (a task class, a credit method, a transport, a builtin model's
recipe). Built-in entries are listed here by the module that registers them, so that the config can
check a name without importing any stage; they are imported on first use. The credit methods' names
are listed once, where their light module registers them (``register(name, builtin=True)``): the
registry imports that module (its ``registrar``) when it first looks a name up or lists them; so
are the weight transports' (``rredcot.transports``). A name
with a dot that is not registered is a module path (``mypkg.mytask``): importing it runs its
``register`` decorators, and the entry is the one registered under that full name or under its last
component (``mytask``). So a user's extension is a new file plus YAML, with no edit to rredcot. An
entry's classes (and a credit method's function) may be named by ``"module:name"`` (``load_class``),
so that registering one imports nothing heavy.
``MODELS`` is asked only for its own names: any other ``model.path`` (``Qwen/Qwen2.5-1.5B``) is a
directory or a hub id, never a module.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from rredcot.common.errors import UserError

T = TypeVar("T")


class RegistryError(UserError):
    """An unknown or unloadable name; the message names the config key and the registered names."""

    label = "config error"


class Registry(Generic[T]):
    """Entries of one kind by name; built-ins load lazily from the modules listed for them."""

    def __init__(self, kind: str, config_key: str, builtins: dict[str, str], registrar: str | None = None) -> None:
        """``builtins``: name -> the module whose import registers it; ``registrar``: a module that
        registers built-ins not listed there (``register(name, builtin=True)``)."""
        self.kind, self.config_key = kind, config_key
        self._builtins = dict(builtins)  # name -> module whose import registers it
        self._registrar = registrar
        self._entries: dict[str, T] = {}

    def register(self, name: str, builtin: bool = False) -> Callable[[T], T]:
        """Decorator: register the decorated object as ``name``; ``builtin``: one of the registrar's."""

        def wrap(entry: T) -> T:
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            if builtin:
                self._builtins[name] = self._registrar
            return entry

        return wrap

    def _load_registrar(self) -> None:
        """Import the registrar, so that its built-ins are registered (no-op once imported)."""
        if self._registrar is not None:
            importlib.import_module(self._registrar)

    def names(self) -> list[str]:
        self._load_registrar()
        return sorted(set(self._builtins) | set(self._entries))

    def is_builtin(self, name: str) -> bool:
        self._load_registrar()
        return name in self._builtins

    def get(self, name: str, where: str | None = None) -> T:
        """The entry called ``name``, importing the module that registers it when needed; ``where``
        names the config key in the error (default: ``<config_key> = <name>``)."""
        if name not in self._entries:
            self._load_registrar()
        if name in self._entries:
            return self._entries[name]
        module = self._builtins.get(name) or (name if "." in name else None)
        if module is None:
            raise self._unknown(name, "", where)
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise self._unknown(name, f" (importing module {module!r} failed: {e})", where) from None
        except Exception as e:  # a user's module that does not compile or raises at import (a built-in's bug: raised)
            if name in self._builtins:
                raise
            why = f" (importing module {module!r} failed: {type(e).__name__}: {e})"
            raise self._unknown(name, why, where) from e
        for candidate in (name, name.rsplit(".", 1)[-1]):
            if candidate in self._entries:
                return self._entries[candidate]
        raise self._unknown(name, f" (module {module!r} registers no {self.kind} of that name)", where)

    def _unknown(self, name: str, why: str, where: str | None = None) -> RegistryError:
        names = "".join(f"{n!r}, " for n in self.names())
        return RegistryError(
            f"{where or f'{self.config_key} = {name!r}'} is not allowed{why}; expected one of {names}"
            f"or the module path of your own {self.kind} (e.g. mypkg.my_{self.kind.split()[-1]})"
        )


def load_class(ref: str | Any) -> Any:
    """``ref`` itself, or the class (or function) a ``"module:name"`` reference names (its module
    imported now)."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def typed_settings(settings_cls: str | type | None, values: dict[str, Any], config_key: str, owner: str) -> Any:
    """``values`` (a plain dict from YAML) as an instance of the entry's settings dataclass (or of the
    one a ``"module:Class"`` reference names).

    Unknown keys and wrong types raise ``RegistryError`` naming ``config_key.<key>``; an entry
    without a settings class (``owner``, e.g. "task 'math'") accepts only an empty dict.
    """
    if settings_cls is None:
        if values:
            raise RegistryError(f"{config_key} = {values!r} is not allowed; expected {{}}: {owner} takes no settings")
        return None
    settings_cls = load_class(settings_cls)
    allowed = {f.name: f for f in dataclasses.fields(settings_cls)}
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise RegistryError(
            f"unknown key {config_key}.{unknown[0]}; keys allowed under {config_key!r}: {sorted(allowed)}"
        )
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(OmegaConf.structured(settings_cls), values)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise RegistryError(f"invalid value for {config_key}.{key}: {str(e).splitlines()[0]}") from None


def make_task(name: str, settings: Any) -> Any:
    """The task ``name`` (``task.name``) built with its typed ``settings`` (``task.settings``, a
    mapping); raises ``RegistryError`` on a bad name or key. What ``tasks.task.build_task`` does,
    here so that the config's checks build a task through the registry alone."""
    cls = TASKS.get(name)
    return cls(typed_settings(cls.Settings, dict(settings), "task.settings", f"task {name!r}"))


TASKS: Registry[Any] = Registry(
    "task",
    "task.name",
    {"math": "rredcot.tasks.math", "arith": "rredcot.tasks.arith", "choice": "rredcot.tasks.choice"},
)
# the built-ins are named where their light module registers them (settings, checks, provers; no
# torch): the config checks them cheaply
CREDIT_METHODS: Registry[Any] = Registry(
    "credit method", "credit.method", {}, registrar="rredcot.redistributor.methods"
)
# the same: the built-in transports are named where ``rredcot.transports`` registers them (no torch)
WEIGHT_TRANSPORTS: Registry[Any] = Registry(
    "weight transport", "generation.weight_transport", {}, registrar="rredcot.transports"
)
# a builtin ``model.path``: its entry turns (name, seed) into the model's directory, built on first use
# (``models.store.resolve_model_path``); any other path is a directory or a hub id, never a module
MODELS: Registry[Any] = Registry(
    "model",
    "model.path",
    {name: "rredcot.models.tiny" for name in ("tiny-qwen3", "tiny-qwen2", "tiny-qwen3-arith")}
    | {name: "rredcot.models.smollm" for name in ("smollm2-135m", "smollm2-135m-chain", "smollm2-135m-chain-think")}
    | {
        name: "rredcot.models.slip_chains"
        for name in ("smollm2-135m-chain-short", "smollm2-135m-chain-long", "qwen2.5-1.5b-chain-long")
    },
)
