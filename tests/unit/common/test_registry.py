"""Registries: names checked by the config, built-ins loaded lazily, user modules by path."""

import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest

from rredcot.common.config import ConfigError, load_config, resolve_credit
from rredcot.common.registry import Registry, RegistryError, typed_settings
from rredcot.redistributor.credit import redistribute_group
from rredcot.redistributor.registry import register
from tests.extensions.last_token import last_token
from tests.factories import rollout_group


def test_unknown_name_lists_the_registered_ones():
    reg = Registry("widget", "widgets.name", {"a": "json"})
    reg.register("b")(object())
    with pytest.raises(RegistryError, match=r"widgets.name = 'c' is not allowed; expected one of 'a', 'b'"):
        reg.get("c")
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("b")(object())


def test_a_registrar_names_its_builtins_where_it_registers_them(tmp_path, monkeypatch):
    """Built-ins listed only in the module that registers them (``registrar``, as the credit methods
    are): the registry imports it when it first needs a name, and tells its entries from a user's."""
    module = f"widgets_{tmp_path.name}"
    reg = Registry("widget", "widgets.name", {}, registrar=module)
    monkeypatch.setitem(sys.modules, "widget_registry", types.SimpleNamespace(WIDGETS=reg))
    (tmp_path / f"{module}.py").write_text(
        "from widget_registry import WIDGETS\nWIDGETS.register('a', builtin=True)('A')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg.register("mine")("M")
    assert reg.get("a") == "A" and module in sys.modules
    assert reg.names() == ["a", "mine"]
    assert reg.is_builtin("a") and not reg.is_builtin("mine")


def test_module_path_is_imported_and_must_register_the_name():
    reg = Registry("widget", "widgets.name", {})
    with pytest.raises(RegistryError, match="importing module 'no_such_pkg.mod' failed"):
        reg.get("no_such_pkg.mod")
    with pytest.raises(RegistryError, match="module 'json.decoder' registers no widget"):
        reg.get("json.decoder")


@dataclass
class Knobs:
    size: int = 3


def test_typed_settings_name_the_key():
    assert typed_settings(Knobs, {"size": 5}, "x.settings", "widget 'k'") == Knobs(5)
    with pytest.raises(RegistryError, match=r"unknown key x.settings.sz; keys allowed under 'x.settings': \['size'\]"):
        typed_settings(Knobs, {"sz": 5}, "x.settings", "widget 'k'")
    with pytest.raises(RegistryError, match="x.settings.size"):
        typed_settings(Knobs, {"size": "big"}, "x.settings", "widget 'k'")


def test_a_credit_method_from_tests_runs_by_config_alone():
    """No edit to rredcot: a module path in ``credit.method``, its settings in its block
    ``credit.settings.last_token`` (the name it registered), its ``check`` run at load."""
    method = "credit.method=tests.extensions.last_token"
    cfg = load_config("tests", [method, "credit.settings.last_token.tail=2"])
    out = redistribute_group(rollout_group(g=3, length=8), cfg, credit=resolve_credit(cfg))
    for s in out.samples:
        np.testing.assert_allclose(s.sigma, [0] * 6 + [0.5, 0.5])
        assert s.credit_method == "last_token"
    with pytest.raises(RegistryError, match="credit method 'grpo' is already registered"):
        register("grpo", return_equivalent=True)(last_token)
    allowed = r"unknown key credit.settings.last_token.head; keys allowed under 'credit.settings.last_token'"
    with pytest.raises(ConfigError, match=allowed):
        load_config("tests", [method, "credit.settings.last_token.head=2"])
    with pytest.raises(ConfigError, match=r"credit.settings.last_token.tail = 25 .*<= generation.max_tokens \(24\)"):
        load_config("tests", [method, "credit.settings.last_token.tail=25"])


@pytest.mark.parametrize(
    ("source", "cause"),
    [("def broken(:\n", "SyntaxError: invalid syntax"), ("raise RuntimeError('boom')\n", "RuntimeError: boom")],
)
def test_a_module_that_fails_to_import_names_the_key_and_the_cause(tmp_path, monkeypatch, source, cause):
    """Not only an ``ImportError``: a user's module that does not compile or raises at import is a
    config error naming ``task.name``, with the cause."""
    package = tmp_path / f"ext_{len(source)}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mytask.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"{package.name}.mytask"
    with pytest.raises(ConfigError) as e:
        load_config("tests", [f"task.name={name}"])
    assert f"task.name = '{name}' is not allowed (importing module '{name}' failed: {cause}" in str(e.value)
