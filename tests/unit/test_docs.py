"""The docs: the config reference (docs/config.md) names every config key and every bundled config;
every relative link and anchor in the README, docs/ and the package folders' READMEs resolves;
every ``rredcot`` command they show parses, and its config with its overrides (and every arm's) loads."""

from __future__ import annotations

import dataclasses
import functools
import re
import shlex
import unicodedata
from pathlib import Path

import pytest

from rredcot.common.config import Config, available_configs, load_config
from rredcot.common.registry import CREDIT_METHODS, TASKS, WEIGHT_TRANSPORTS, load_class
from rredcot.launch.cli import benchmarks, parse_args
from rredcot.launch.study.compare import arm_overrides

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
    credit_doc = (DOCS / "credit.md").read_text(encoding="utf-8")  # in full, or bare in its key lists
    missing = [k for k in keys if f"`{k}`" not in credit_doc and f"`{k.rsplit('.', 1)[1]}`" not in credit_doc]
    assert not missing, f"docs/credit.md does not name: {missing}"


def test_every_bundled_config_is_documented(config_doc: str) -> None:
    names = available_configs()
    assert "tests" in names and "demo_cpu" in names
    missing = [n for n in names if f"`{n}`" not in config_doc]
    assert not missing, f"docs/config.md does not mention the bundled configs: {missing}"


ROOT = DOCS.parent
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(ROOT.glob("rredcot/*/README.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@functools.cache
def prose(path: Path) -> str:
    """A markdown page without its fenced code blocks (no headings or links there)."""
    return re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)


def github_anchor(heading: str, seen: dict[str, int]) -> str:
    """The anchor GitHub gives a heading: lower case, only letters, marks, numbers, ``_``, spaces and
    ``-`` kept, spaces as ``-``; a repeated anchor gets ``-1``, ``-2``, ..."""
    kept = "".join(c for c in heading.lower() if c in " -" or unicodedata.category(c)[0] in "LMN" or c == "_")
    slug = kept.replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    return f"{slug}-{n}" if n else slug


@functools.cache
def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    return {github_anchor(m[1].strip(), seen) for m in re.finditer(r"^#{1,6} (.+)$", prose(path), flags=re.M)}


def test_github_anchor_on_hand_cases() -> None:
    seen: dict[str, int] = {}
    assert github_anchor("On the chain task (issue 36): five seeds, `grpo` against `rredcot`", seen) == (
        "on-the-chain-task-issue-36-five-seeds-grpo-against-rredcot"
    )
    assert (
        github_anchor("Slip localisation (`bench/credit_quality.py`)", seen)
        == "slip-localisation-benchcredit_qualitypy"
    )
    assert github_anchor("σ × 2 – again", seen) == "σ--2--again"
    assert [github_anchor("Seed 2", seen) for _ in range(3)] == ["seed-2", "seed-2-1", "seed-2-2"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    """A user clicks these: every relative link names a file that exists, and every ``#anchor`` a
    heading of that file."""
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


PLACEHOLDER = re.compile(r"^[A-Z]+$|[<…]|\.\.\.")  # CONFIG, N, <t>, …: a value for the user to fill in


def fenced_commands() -> list[tuple[str, list[str]]]:
    """(page, arguments after ``rredcot``) of every ``rredcot`` command in the docs' code blocks,
    continuation lines joined, comments dropped, one per ``&&`` / ``;`` part."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                if line.lstrip().startswith("#"):
                    continue
                for part in re.split(r"&&|;", line.split(" #")[0]):
                    if m := re.match(r"\s*(?:\.venv/bin/)?rredcot (.*)", part):
                        found.append((page.name, shlex.split(m[1])))
    return found


def inline_overrides() -> list[tuple[str, str, str]]:
    """(page, config, ``key=value``) of every override in an inline ``rredcot ...`` code span, its
    arms' overrides included; the config is the span's bundled config, else ``demo_cpu``."""
    found = []
    for page in PAGES:
        for span in re.findall(r"`(?:\.venv/bin/)?rredcot ([^`]+)`", prose(page)):
            words = span.split()
            config = next((w for w in words if w in available_configs()), "demo_cpu")
            for word in words:
                for item in word.split(",") if "@" in word else [word]:
                    for override in item.split("@")[1:] if "@" in item else [item]:
                        key, eq, value = override.partition("=")
                        if eq and re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", key) and not PLACEHOLDER.search(value):
                            found.append((page.name, config, override))
    return found


def test_the_docs_show_commands_to_check() -> None:
    commands, overrides = fenced_commands(), inline_overrides()
    assert len(commands) >= 25 and ["config", "list"] in [argv for _, argv in commands]
    assert len(overrides) >= 20
    assert ("study.md", "study_cpu", "credit.settings.rredcot.suffix_window=2") in overrides


def test_every_documented_command_parses_and_its_config_loads() -> None:
    """A command copied from the docs runs: argparse accepts it, its config with its overrides loads
    and validates (a renamed key fails here), every ``--methods`` arm's too, and a benchmark exists."""
    broken = []
    for page, argv in fenced_commands():
        try:
            args = parse_args(argv)
        except SystemExit:
            broken.append(f"{page}: rredcot {shlex.join(argv)}: not accepted by the CLI")
            continue
        if args.command == "bench" and args.name not in benchmarks():
            broken.append(f"{page}: no benchmark {args.name}")
        config = getattr(args, "config", None)
        if config is None or not (config in available_configs() or (ROOT / config).exists()):
            continue  # a placeholder (CONFIG) or the user's own file
        arms = [arm_overrides(m) for m in getattr(args, "methods", "").split(",") if m] or [[]]
        for arm in arms:
            try:
                load_config(config, [*args.overrides, *arm])
            except Exception as e:
                broken.append(f"{page}: rredcot {shlex.join(argv)}: {e}")
    assert not broken, "\n".join(broken)


def test_every_override_in_the_docs_inline_commands_is_valid() -> None:
    broken = []
    for page, config, override in inline_overrides():
        try:
            load_config(config, [override])
        except Exception as e:
            broken.append(f"{page}: {override} on {config}: {e}")
    assert not broken, "\n".join(broken)


BENCHMARKS = DOCS / "benchmarks.md"
ROW_LIMIT = 400  # characters of a table row; a longer row's prose goes in a paragraph below the table
SECTIONS = {f.name for f in dataclasses.fields(Config)}
FILE = re.compile(r"\.(md|py|sh|ya?ml|json|jsonl|toml|txt|log|msgpack|parquet)$")  # credit.md: a file


def settable_keys() -> set[str]:
    """Every key a config can set, and every block above one: the schema's keys and each built-in's
    settings (``task.settings.<key>``, ``credit.settings.<method>.<key>``,
    ``generation.transport_settings.<key>``)."""
    keys = set(dotted_keys(Config()))
    for block, registry, settings in (
        ("task.settings", TASKS, lambda entry: entry.Settings),
        ("credit.settings.{name}", CREDIT_METHODS, lambda entry: entry.settings),
        ("generation.transport_settings", WEIGHT_TRANSPORTS, lambda entry: entry.settings),
    ):
        for name in filter(registry.is_builtin, registry.names()):
            cls = settings(registry.get(name))
            fields = dataclasses.fields(load_class(cls)) if cls is not None else ()
            keys |= {f"{block.format(name=name)}.{f.name}" for f in fields}
    return {key.rsplit(".", n)[0] for key in keys for n in range(key.count(".") + 1)}


def config_keys_named(text: str) -> set[str]:
    """The dotted config keys a page's code spans name: dotted words that start with a config section
    (``credit.scorer.model``, the key of ``generation.retire_solved=2``), file names aside."""
    found = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for key in re.findall(r"(?<![\w./-])([a-z_]+(?:\.[a-z0-9_]+)+)", span):
            if key.split(".")[0] in SECTIONS and not FILE.search(key):
                found.add(key)
    return found


def test_config_keys_named_on_hand_cases() -> None:
    text = "`credit.md`, `rredcot@credit.settings.rredcot.uniform_mix=1.0`, `x.generation.y`, `run.dir`, `bench/x.py`"
    assert config_keys_named(text) == {"credit.settings.rredcot.uniform_mix", "run.dir"}
    assert {"credit.scorer", "credit.settings.mc.samples", "task.settings.op"} <= settable_keys()
    assert "credit.uniform_mix" not in settable_keys()


def test_benchmarks_rows_are_short_and_name_only_current_keys() -> None:
    """A row is read at a glance (its prose in a paragraph below the table), and a key the page
    names is one a config can set now (a removed key is said in words)."""
    text = BENCHMARKS.read_text(encoding="utf-8")
    long = [
        f"line {n}: {len(line)} characters"
        for n, line in enumerate(text.splitlines(), 1)
        if line.startswith("|") and len(line) > ROW_LIMIT
    ]
    assert not long, f"benchmarks.md rows over {ROW_LIMIT} characters: {long}"
    unknown = sorted(config_keys_named(text) - settable_keys())
    assert not unknown, f"benchmarks.md names config keys that do not exist: {unknown}"
