"""Fixtures of the tests that run real vLLM-CPU engines (actors, transports): tiny random models saved as HF
dirs, HF reference log-probs; a plugin of the root conftest (`pytest_plugins`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from rredcot.actors.engine import Engine, EngineSpec, Sampling
from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir, save_model_dir
from rredcot.models.tiny import build_tiny_model

KV_BYTES = 16 * 2**20


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(qwen_tokenizer_dir())


def make_model(arch: str, seed: int, tie: bool):
    """A tiny model whose logits are peaked enough for greedy decoding to be unambiguous."""
    model = build_tiny_model(arch, seed=seed, tie=tie)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(20.0)
        if not tie:
            model.get_output_embeddings().weight.mul_(20.0)
    return model


def hf_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log p(completion[j] | prompt + completion[:j]) under ``model`` at ``temperature``."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids, logits_to_keep=len(completion) + 1).logits[0, :-1].float()  # the rows that predict it
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(1, torch.tensor(completion)[:, None])[:, 0]


def weights(model) -> dict[str, torch.Tensor]:
    """The learner's publication format: ``named_parameters()`` (tied lm_head omitted)."""
    return {k: v.detach().contiguous() for k, v in model.named_parameters()}


def hf_greedy(model, prompt: list[int], max_tokens: int, eos: int | None = None) -> list[int]:
    """A plain greedy loop: no KV cache, the whole sequence every step; stops after ``max_tokens``
    tokens or once it has emitted ``eos``."""
    ids = list(prompt)
    with torch.no_grad():
        while len(ids) - len(prompt) < max_tokens and (len(ids) == len(prompt) or ids[-1] != eos):
            ids.append(int(model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1].argmax()))
    return ids[len(prompt) :]


PROMPTS = [[9707, 11, 1879, 0], [785, 3974, 13876, 38835, 30, 1207]]


def check_greedy(engine: Engine, model, version: int) -> None:
    """The engine's greedy completions and their log-probs are ``model``'s, all tokens of ``version``."""
    greedy = Sampling(temperature=0.0, max_tokens=10)
    for prompt, group in zip(PROMPTS, engine.generate(PROMPTS, greedy)):
        (c,) = group.completions
        assert c.token_ids == hf_greedy(model, prompt, len(c.token_ids))
        assert c.version_runs == [(0, version)]
        torch.testing.assert_close(torch.tensor(c.logprobs), hf_logprobs(model, prompt, c.token_ids), atol=1e-4, rtol=0)


@pytest.fixture(scope="session")
def helpers() -> SimpleNamespace:
    return SimpleNamespace(
        make_model=make_model,
        hf_logprobs=hf_logprobs,
        hf_greedy=hf_greedy,
        weights=weights,
        save=lambda model, tok, out: str(save_model_dir(model, tok, out)),
        kv_bytes=KV_BYTES,
        check_greedy=check_greedy,
        prompts=PROMPTS,
    )


# Engines are module-scoped and closed at the module's end: vLLM's parallel state is process-wide,
# and closing any engine (another test file's, in the same xdist worker) takes it down for every
# engine alive then, so an engine must not outlive the test file that made it.
def _tied(root: Path, tokenizer, helpers, seeded: bool):
    m0, m1 = helpers.make_model("qwen3", 0, tie=True), helpers.make_model("qwen3", 1, tie=True)
    path = helpers.save(m0, tokenizer, root / "m0")
    save_file(helpers.weights(m1), str(root / "v1.safetensors"))
    engine = Engine(EngineSpec(path, max_model_len=128, kv_cache_bytes=helpers.kv_bytes, seed=0, seeded=seeded))
    yield engine, m0, m1, str(root / "v1.safetensors")
    engine.close()


@pytest.fixture(scope="module")
def tied(module_dir, tokenizer, helpers):
    """A tied-embedding Qwen3 engine and its two weight versions (v0 loaded, v1 as a file)."""
    yield from _tied(module_dir / "tied", tokenizer, helpers, seeded=False)


@pytest.fixture(scope="module")
def tied_seeded(module_dir, tokenizer, helpers):
    """The same with ``EngineSpec(seeded=True)``: requests may carry seeds (MC continuations)."""
    yield from _tied(module_dir / "tied_seeded", tokenizer, helpers, seeded=True)


@pytest.fixture(scope="module")
def untied(module_dir, tokenizer, helpers):
    """An untied Qwen2 engine (v0 loaded) and a second weight version; it takes stop strings."""
    m0, m1 = helpers.make_model("qwen2", 2, tie=False), helpers.make_model("qwen2", 3, tie=False)
    path = helpers.save(m0, tokenizer, module_dir / "untied" / "m0")
    engine = Engine(EngineSpec(path, max_model_len=128, kv_cache_bytes=helpers.kv_bytes, stop_strings=True))
    yield engine, m0, m1
    engine.close()
