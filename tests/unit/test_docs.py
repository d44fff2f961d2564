"""The config reference (docs/config.md) names every config key and every bundled config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rredcot.common.config import Config, available_configs
from rredcot.common.registry import CREDIT_METHODS, load_class

DOCS = Path(__file__).resolve().parents[2] / "docs"


def dotted_keys(node: object, prefix: str = "") -> list[str]:
    """Every leaf key of a config dataclass tree, dotted (``credit.segmentation.segments``)."""
    keys = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            keys += dotted_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


@pytest.fixture(scope="module")
def config_doc() -> str:
    return (DOCS / "config.md").read_text(encoding="utf-8")


def test_walk_finds_nested_keys() -> None:
    keys = dotted_keys(Config())
    assert "credit.segmentation.segments" in keys and "redis.url" in keys and "run.name" in keys
    assert len(keys) == len(set(keys)) and len(keys) > 50


def test_every_config_key_is_documented(config_doc: str) -> None:
    missing = [k for k in dotted_keys(Config()) if f"`{k}`" not in config_doc]
    assert not missing, f"docs/config.md does not document: {missing}"


def test_every_builtin_credit_methods_settings_are_documented(config_doc: str) -> None:
    """Each built-in method's block (``credit.settings.<method>.<key>``) is in the credit section."""
    keys = []
    for name in filter(CREDIT_METHODS.is_builtin, CREDIT_METHODS.names()):  # not a test's own method
        settings = CREDIT_METHODS.get(name).settings
        if settings is not None:
            keys += [f"credit.settings.{name}.{f.name}" for f in dataclasses.fields(load_class(settings))]
    assert "credit.settings.rredcot.uniform_mix" in keys and "credit.settings.mc.samples" in keys
    missing = [k for k in keys if f"`{k}`" not in config_doc]
    assert not missing, f"docs/config.md does not document: {missing}"


def test_every_bundled_config_is_documented(config_doc: str) -> None:
    names = available_configs()
    assert "tests" in names and "demo_cpu" in names
    missing = [n for n in names if f"`{n}`" not in config_doc]
    assert not missing, f"docs/config.md does not mention the bundled configs: {missing}"
