"""The demo model is converted once, whichever process asks first (a first run's workers all do)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig

from rredcot.models.smollm import SMOLLM2_SHAPE, smollm2_tokenizer_dir
from rredcot.models.store import load_tokenizer

ROOT = Path(__file__).resolve().parents[3]  # the repository, where ``tests`` imports from


@pytest.mark.slow  # converts the demo model twice at once
def test_the_demo_model_converted_by_two_processes_at_once(tmp_path):
    """Two processes convert the demo's GGUF into the same cache at the same moment (the generator,
    redistributor, learner and evaluator of a first ``rredcot train`` do): both get the one
    complete directory. Before the lock, the second one's temporary directory was renamed away
    under it (``SafetensorError: … No such file or directory``) and the run failed."""
    code = "import sys; from rredcot.models.smollm import smollm2_dir; print(smollm2_dir(sys.argv[1]))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == str(tmp_path / "smollm2-135m-instruct")
    assert json.loads((tmp_path / "smollm2-135m-instruct" / "rredcot.json").read_text())["source"].endswith(".gguf")
    converted = json.loads((tmp_path / "smollm2-135m-instruct" / "config.json").read_text())
    assert {k: converted[k] for k in SMOLLM2_SHAPE} == SMOLLM2_SHAPE  # the shape the memory check assumes before
    assert AutoConfig.from_pretrained(outs[0]).tie_word_embeddings
    built = sorted(p.name for p in tmp_path.iterdir())  # the tokenizer builtin the conversion takes its files from
    assert built == [
        "smollm2-135m-instruct",
        "smollm2-135m-instruct.lock",
        "smollm2-135m-tokenizer",
        "smollm2-135m-tokenizer.lock",
    ]
    # the tokenizer builtin (what training pairs' digests read, from the suite's cache) is the converted model's
    alone, whole = load_tokenizer(smollm2_tokenizer_dir()), load_tokenizer(outs[0])
    text = "<|im_start|>user\nStep 2: 12 * 14 = 168.\nAnswer: 168<|im_end|>"
    assert alone(text)["input_ids"] == whole(text)["input_ids"] and alone.eos_token_id == whole.eos_token_id
    assert alone.get_vocab() == whole.get_vocab() and alone.chat_template == whole.chat_template
