"""Built-in models are made once, whichever process asks first (a first run's workers all do)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig

from rredcot.common.models import build_once, recipe_dir

ROOT = Path(__file__).resolve().parents[3]  # the repository, where ``tests`` imports from


def test_build_once_builds_once_and_others_wait(tmp_path):
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        out.mkdir()

    target = tmp_path / "m"
    assert build_once(target, build, {"v": 1}) == target == build_once(target, build, {"v": 1})
    assert len(calls) == 1 and calls[0] != target and not calls[0].exists()  # built aside, renamed
    assert json.loads((target / "rredcot.json").read_text()) == {"v": 1}


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


@pytest.mark.slow  # converts the demo model twice at once
def test_the_demo_model_converted_by_two_processes_at_once(tmp_path):
    """Two processes convert the demo's GGUF into the same cache at the same moment (the generator,
    redistributor, learner and evaluator of a first ``rredcot train`` do): both get the one
    complete directory. Before the lock, the second one's temporary directory was renamed away
    under it (``SafetensorError: … No such file or directory``) and the run failed."""
    code = "import sys; from rredcot.common.smollm import smollm2_dir; print(smollm2_dir(sys.argv[1]))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == str(tmp_path / "smollm2-135m-instruct")
    assert json.loads((tmp_path / "smollm2-135m-instruct" / "rredcot.json").read_text())["source"].endswith(".gguf")
    assert AutoConfig.from_pretrained(outs[0]).tie_word_embeddings
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-instruct", "smollm2-135m-instruct.lock"]
