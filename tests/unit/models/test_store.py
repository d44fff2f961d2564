"""Built-in models are made once, whichever process asks first (a first run's workers all do); a
builtin name resolves through its recipe, any other path is left as it is."""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from rredcot.common.registry import MODELS
from rredcot.models.store import (
    build_once,
    builds_under_way,
    load_decoder,
    load_tokenizer,
    qwen_tokenizer_dir,
    recipe_dir,
    resolve_model_path,
)


def test_a_build_runs_on_every_core_and_the_threads_are_put_back(tmp_path):
    """A worker with one thread (the demo's learner) builds a model on every core, then trains on one.
    In a process of its own: an in-process vLLM engine of an earlier test pins torch's threads."""
    script = f"""
import os, torch
from pathlib import Path
from rredcot.models.store import build_once
torch.set_num_threads(1)
seen = []
build_once(Path({str(tmp_path / "m")!r}), lambda out: (seen.append(torch.get_num_threads()), out.mkdir()), {{"v": 1}})
print(seen == [len(os.sched_getaffinity(0))], torch.get_num_threads())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "1"], out


def test_build_once_builds_once_and_others_wait(tmp_path):
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        out.mkdir()

    target = tmp_path / "m"
    assert build_once(target, build, {"v": 1}) == target == build_once(target, build, {"v": 1})
    assert len(calls) == 1 and calls[0] != target and not calls[0].exists()  # built aside, renamed
    assert json.loads((target / "rredcot.json").read_text()) == {"v": 1}


def test_a_build_and_a_wait_say_so(tmp_path, caplog):
    """A first use that builds (minutes for a warm start) says what it builds and how long it took;
    a process that finds another building says it waits, instead of falling silent."""
    caplog.set_level(logging.INFO, logger="rredcot.models.store")
    target = tmp_path / "m"
    with open(target.with_name("m.lock"), "w") as held:  # another process building it
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=build_once, args=(target, lambda out: out.mkdir(), {"v": 1}))
        waiter.start()
        deadline = time.monotonic() + 10
        while "waiting for another process that builds" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not target.exists()
    waiter.join(10)
    assert f"waiting for another process that builds {target}" in caplog.text
    assert f"building {target} once on this machine" in caplog.text and f"built {target} in " in caplog.text
    assert (target / "rredcot.json").exists()


def test_a_build_under_way_is_seen_by_other_processes_and_nothing_else_is(tmp_path):
    """While ``build_once`` holds a model's lock, ``builds_under_way`` names it with its time so far
    (what the driver's progress line shows); a lock left by a finished or dead builder names nothing."""
    seen: list[list[tuple[str, float]]] = []
    build_once(tmp_path / "done", lambda out: out.mkdir(), {"v": 1})  # built: its lock file stays, unheld
    build_once(tmp_path / "m", lambda out: (seen.append(builds_under_way(tmp_path)), out.mkdir()), {"v": 1})
    assert [name for name, _ in seen[0]] == ["m"] and 0 <= seen[0][0][1] < 60
    assert builds_under_way(tmp_path) == [] and builds_under_way(tmp_path / "none") == []


def test_each_recipe_builds_into_a_directory_of_its_own(tmp_path):
    """A cache from an older rredcot (another warm-start prompt, other settings) is not reused, and
    not replaced either: another process (a checkout sharing the cache) may be reading it."""

    def build_with(name: str):
        def build(out: Path) -> None:
            out.mkdir()
            (out / name).write_text(name)

        return build

    old, new = (recipe_dir(tmp_path, "m", {"sft": d}) for d in ("aaaa", "bbbb"))
    assert old != new and old.parent == tmp_path and old.name.startswith("m-")
    assert recipe_dir(tmp_path, "m", {"sft": "aaaa"}) == old  # the same recipe, the same place
    build_once(old, build_with("old"), {"sft": "aaaa"})
    build_once(new, build_with("new"), {"sft": "bbbb"})
    assert (old / "old").exists() and (new / "new").exists()
    build_once(new, build_with("again"), {"sft": "bbbb"})  # built: reused
    assert not (new / "again").exists()


def test_every_builtin_model_is_registered_by_the_module_named_for_it():
    """``MODELS`` names each builtin's recipe module; importing it registers the name (nothing is built)."""
    from rredcot.models.slip_chains import SLIP_CHAIN_MODELS
    from rredcot.models.smollm import BUILTINS
    from rredcot.models.tiny import TINY_MODELS

    assert set(MODELS.names()) == {*TINY_MODELS, *BUILTINS, *SLIP_CHAIN_MODELS}
    assert all(callable(MODELS.get(name)) for name in MODELS.names())


def test_a_path_that_is_no_builtin_is_returned_as_it_is(tmp_path):
    """A hub id has dots and slashes: it is never imported as a module."""
    for path in ("Qwen/Qwen2.5-1.5B", "Qwen2.5-1.5B", str(tmp_path), "mypkg.model"):
        assert resolve_model_path(path, seed=3) == path


def test_the_decoder_decodes_every_token_as_the_tokenizer_does(qwen_tok, tmp_path):
    """The report's decoder (the plain fast tokenizer) gives each token the text the model's own
    tokenizer class gives it (every 97th id of the vocabulary and every added token); without a
    tokenizer.json it is the model's own class."""
    decoder = load_decoder(qwen_tokenizer_dir())
    ids = [*range(0, len(qwen_tok), 97), *qwen_tok.added_tokens_decoder]
    singles = [[i] for i in ids]
    assert decoder.batch_decode(singles, skip_special_tokens=False) == qwen_tok.batch_decode(
        singles, skip_special_tokens=False
    )
    text = qwen_tok.apply_chat_template([{"role": "user", "content": "12 * 14 = ?"}], tokenize=False)
    assert decoder.decode(qwen_tok(text)["input_ids"]) == text
    for name in ("merges.txt", "vocab.json", "tokenizer_config.json"):
        shutil.copy(qwen_tokenizer_dir() / name, tmp_path / name)
    assert type(load_decoder(tmp_path)) is type(load_tokenizer(tmp_path)) is type(qwen_tok)
