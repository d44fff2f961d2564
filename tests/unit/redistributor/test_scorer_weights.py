"""The scorer follows the policy through the run's weight transport, with the receiver a generator
has: the built-in ``file`` and ``ipc`` and docs/extending.md's example transport, from outside rredcot."""

from __future__ import annotations

import pytest
import torch

from rredcot.common.config import load_config
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.learner.weights import publish
from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.scorer_weights import ScorerPort
from rredcot.transports import weight_receiver
from rredcot.transports.ports import WeightsLost
from rredcot.transports.slots import files_wanted

TRANSPORTS = [("file", "{}"), ("ipc", "{memory: host}"), ("tests.extensions.redis_weights", "{keep: 1}")]


def _scorer() -> Scorer:
    return Scorer(build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), "\n")


@pytest.mark.parametrize(("transport", "settings"), TRANSPORTS)
def test_each_published_version_reaches_the_scorer(redis_client, run_id, tmp_path, transport, settings) -> None:
    overrides = [f"generation.weight_transport={transport}", f"generation.transport_settings={settings}"]
    cfg = load_config("tests", [f"run.name={run_id}", f"run.dir={tmp_path}", "credit.scorer.model=policy", *overrides])
    publisher = WEIGHT_TRANSPORTS.get(transport).publisher_class().from_config(cfg, redis_client, tmp_path / "w")
    scorer = _scorer()
    receiver = weight_receiver(cfg, redis_client, ScorerPort(scorer), name="red0")
    assert receiver.poll() is None and receiver.name == "red0"  # nothing published yet
    for version, seed in ((1, 5), (2, 6)):
        policy = build_tiny_model("qwen3", seed=seed)
        publish(publisher, policy, version)
        applied, seconds = receiver.poll()
        assert applied == scorer.version == version and seconds > 0
        for (name, a), b in zip(scorer.model.state_dict().items(), policy.state_dict().values(), strict=True):
            assert torch.equal(a, b), name
        assert receiver.poll() is None  # applied once
    assert not files_wanted(redis_client, run_id)  # on the learner's node: slots, not files, for ipc
    publisher.close()


def test_a_version_that_does_not_fit_the_scorer_loses_it(redis_client, run_id, tmp_path) -> None:
    """A policy of another shape: load_state_dict copies what fits before it raises, so the scorer's
    weights are a mix and its worker must end (its supervisor restarts it), not score on."""
    cfg = load_config("tests", [f"run.name={run_id}", f"run.dir={tmp_path}", "credit.scorer.model=policy"])
    publisher = WEIGHT_TRANSPORTS.get("file").publisher_class().from_config(cfg, redis_client, tmp_path / "w")
    publish(publisher, build_tiny_model("qwen2", seed=1), 1)
    scorer = _scorer()
    with pytest.raises(WeightsLost, match="weights v1 failed part-way into a scorer holding v0"):
        weight_receiver(cfg, redis_client, ScorerPort(scorer), name="red0").poll()
    publisher.close()
