"""The tiny model's warm-start recipe: its digest moves with the tokenizer's files and the code that
makes its training pairs, and computing it loads no tokenizer (every process that resolves the model's
path computes it)."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

from rredcot.models import warmstart
from rredcot.models.store import qwen_tokenizer_dir


def test_the_recipe_moves_with_the_tokenizer_files(tmp_path, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: pytest.fail("loaded"))
    warmstart.arith_recipe.cache_clear()
    before = warmstart.arith_recipe(0)
    assert warmstart.arith_recipe(1) != before  # the seed is part of it
    copy = tmp_path / "tokenizer"
    shutil.copytree(qwen_tokenizer_dir(), copy)
    monkeypatch.setattr(warmstart, "qwen_tokenizer_dir", lambda: copy)
    warmstart.arith_recipe.cache_clear()
    assert warmstart.arith_recipe(0) == before  # the same bytes, the same recipe
    config = copy / "tokenizer_config.json"
    config.write_text(config.read_text().replace("<|im_end|>", "<|endoftext|>", 1))
    warmstart.arith_recipe.cache_clear()
    assert warmstart.arith_recipe(0) != before
    warmstart.arith_recipe.cache_clear()


@pytest.mark.parametrize("module", ["rredcot.tasks.prompts", "rredcot.tasks.arith", "rredcot.models.warmstart"])
def test_the_recipe_reads_the_code_of_the_pairs_and_the_steps(module):
    """The files the digest covers: what writes the problems and prompts, and the SFT loop."""
    importlib.import_module(module)
    assert Path(sys.modules[module].__file__).resolve() in {p.resolve() for p in warmstart.recipe_files()}


def test_a_pair_drawn_twice_goes_forward_once_for_the_same_loss():
    """``unique``: a batch's distinct pairs forward once, each token's loss counted as often as its pair
    was drawn: the loss of forwarding every draw (3 pairs drawn 8 times: repeats certain)."""
    from types import SimpleNamespace

    from rredcot.models.tiny import build_tiny_model

    pairs = [([1, 2, 3], [4, 5]), ([6, 7], [8, 9, 10, 11]), ([12], [13])]
    losses: dict[bool, list[float]] = {False: [], True: []}
    for unique, seen in losses.items():
        model = build_tiny_model("qwen3", seed=0, vocab_size=64)
        tokenizer = SimpleNamespace(pad_token_id=0)
        warmstart.sft(
            model, tokenizer, pairs, 1, 0.0, 8, seed=3, unique=unique, log=lambda _, v, seen=seen: seen.append(v)
        )
    assert losses[True][0] == pytest.approx(losses[False][0], rel=1e-6)
