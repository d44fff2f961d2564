"""Worker pieces: the MC reward function, the metrics snapshot (with what σ did, for the run
report), the scorer's attention check, and the credit method the worker is handed."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from rredcot.common.config import ConfigError, TaskConfig, load_config, resolve_credit
from rredcot.common.onednn import PRIMITIVE_CACHE, PRIMITIVE_CACHE_ENV
from rredcot.common.records import WeightedSample
from rredcot.models.store import qwen_tokenizer_dir
from rredcot.redistributor import worker
from rredcot.redistributor.blame import SlipBlame
from rredcot.redistributor.credit import redistribute_group
from rredcot.redistributor.worker import Redistributor, WorkerMetrics, build_scorer, verifier_reward
from rredcot.tasks.verifier import Verifier
from tests.factories import rollout
from tests.unit.redistributor.test_oracle import chain, group_of, slipped, text


def test_verifier_reward_on_real_tokens(qwen_tok) -> None:
    verifier = Verifier(TaskConfig("math"))
    reward = verifier_reward(verifier, qwen_tok)
    enc = lambda t: qwen_tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert reward(enc("<think>\n12*7 = 84\n</think>\n\nAnswer: 84"), "84") == 1.0
    assert reward(enc("So the result is \\boxed{\\frac{168}{2}}"), "84") == 1.0
    assert reward(enc("Answer: 85"), "84") == 0.0
    assert reward(enc("I am not sure"), "84") == 0.0
    guess = enc("6 * 14 is it? Maybe the answer: 84\nWait, let me check 6 * 14")  # still thinking: no answer
    assert reward(guess, "84") == 1.0 and reward(guess, "84", opened=True) == 0.0
    assert reward(enc("6 * 14 = 84\n</think>\nAnswer: 84"), "84", opened=True) == 1.0
    verifier.close()


def test_metrics_rates() -> None:
    m = WorkerMetrics(rollouts=8, tokens=400, busy_s=2.0)
    snap = m.snapshot()
    assert snap["rollouts_per_s"] == 4.0 and snap["tokens_per_s"] == 200.0
    assert WorkerMetrics().snapshot()["tokens_per_s"] == 0.0


def test_metrics_per_length_bucket() -> None:
    """σ fallbacks and concentration are counted per completion-length bucket (``common.ledger.length_bucket``)."""
    m = WorkerMetrics()
    e = np.zeros(0, np.float32)
    for n, sigma, reason in [(4, [0.7, 0.1, 0.1, 0.1], ""), (4, [0.25] * 4, "zero_mass"), (2000, None, "underflow")]:
        sigma = np.full(n, 1 / n, np.float32) if sigma is None else np.array(sigma, np.float32)
        sample = WeightedSample(rollout("g", 0, n), 1.0, sigma, e.astype(np.int32), e, e, "rredcot", {}, reason)
        m.count_sample(sample, int)
    snap = m.snapshot()
    assert snap["samples.lt1k"] == 2 and snap["samples.lt4k"] == 1 and snap["uniform_zero_mass.lt1k"] == 1
    assert snap["uniform_underflow.lt4k"] == 1 and "uniform_underflow.lt1k" not in snap
    assert snap["sigma_peak.lt1k"] == np.float32(0.7) * 4 and snap["sigma_peak.lt4k"] == np.float32(1 / 2000) * 2000


def test_metrics_of_what_sigma_did() -> None:
    """Segments of the segmented samples; max σ·|o| of the wrong traces taking blame (A < 0, not
    correct); the checker's hits and a uniform pick's (1/lines), summed for the report to divide."""
    m = WorkerMetrics()
    cases = [  # (σ, exit points, advantage, reward, blame)
        ([0.7, 0.1, 0.1, 0.1], [0, 2, 4], -1.0, 0.0, SlipBlame(1, "x", (2, 4), 3, 1.0)),  # peak 2.8, 2 segments
        ([0.25] * 4, [0, 1, 2, 4], -0.5, 0.0, SlipBlame(0, "y", (0, 1), 2, 0.5)),  # peak 1.0, 3 segments
        ([0.4, 0.2, 0.2, 0.2], [], 1.0, 1.0, None),  # correct, not segmented
        ([0.1, 0.1, 0.1, 0.7], [0, 4], 0.0, 0.0, None),  # wrong but no blame to take (A = 0): 1 segment
    ]
    for sigma, exits, adv, reward, blame in cases:
        e = np.zeros(0, np.float32)
        w = WeightedSample(
            rollout("g", 0, 4, reward=reward), adv, np.array(sigma, np.float32), np.array(exits, np.int32), e, e, "x"
        )
        m.count_sample(w, int, blame)
    snap = m.snapshot()
    assert (snap["segmented_samples"], snap["segments"], snap["wrong_samples"]) == (3, 6, 2)
    assert snap["wrong_sigma_peak_sum"] == pytest.approx(2.8 + 1.0)
    assert (snap["slip_named"], snap["slip_top_blame"]) == (2, 1.5)
    assert snap["slip_top_chance"] == pytest.approx(1 / 3 + 1 / 2)


def test_mc_metrics_stderr_and_version_gap() -> None:
    """MC samples count their version gap (MC policy − the trace's newest token version, in updates
    along the run's history) in a histogram and a mean, and their finite standard errors in a mean; a
    fixed prover's samples count only their errors; other samples count in neither."""
    m = WorkerMetrics()
    renumbered = {7: 2, 8: 3}  # a restore republished version 2's weights as 7 (``VersionLineage``)
    e = np.zeros(3, np.float32)
    for versions, mc_version, stderr in [
        (((0, 2),), 3, [0.2, 0.4, 0.0]),
        (((0, 1), (5, 2)), 3, [0.3, np.nan, 0.1]),  # the trace ends on v2: gap 1
        (((0, 4),), 3, [0.0, 0.0, 0.0]),  # the generator was ahead of the MC engine: gap -1
        (((0, 0),), -1, [0.5]),  # a fixed prover's MC (progress): its error counts, no version gap
        (((0, 0),), -1, []),  # not MC
        (((0, 6),), 8, [0.0]),  # trace on 6, discarded by the restore; MC on 8 (position 3): gap -3, not +2
    ]:
        r = rollout("g", 0, 10, versions=versions)
        w = WeightedSample(
            r,
            1.0,
            np.full(10, 0.1, np.float32),
            e.astype(np.int32),
            e,
            e[:2],
            "mc",
            {},
            "",
            np.array(stderr, np.float32),
            mc_version,
        )
        m.count_sample(w, lambda v: renumbered.get(v, v))
    snap = m.snapshot()
    assert snap["mc_version_gap.1"] == 2 and snap["mc_version_gap.-1"] == 1 and snap["mc_version_gap.-3"] == 1
    assert snap["mc_samples"] == 4 and "mc_version_gap.2" not in snap
    assert snap["mc_version_gap_mean"] == pytest.approx(-2 / 4) and snap["mc_exits"] == 10
    assert snap["mc_stderr_mean"] == pytest.approx(1.5 / 10)
    assert WorkerMetrics().snapshot()["mc_stderr_mean"] == 0.0


def test_flex_branch_attention_is_refused_without_a_gpu() -> None:
    """``credit.scorer.branch_attention=flex`` needs compiled flex attention on a CUDA scorer; a
    redistributor without one says so, naming the key and the alternatives, before any work (the
    config asks for a redistributor GPU, which passes the load-time rule: a node without one)."""
    if torch.cuda.is_available():
        pytest.skip("a GPU scorer may use flex (tests/gpu/test_values_cuda.py)")
    with pytest.raises(ConfigError, match="credit.scorer.branch_attention = 'flex'.*'auto' or 'dense'"):
        build_scorer(load_config("tests", ["credit.scorer.branch_attention=flex", "cluster.gpus_per_redistributor=1"]))
    assert build_scorer(load_config("tests", ["credit.scorer.branch_attention=dense"])).model.device.type == "cpu"


def test_the_scorer_bounds_onednns_primitive_cache_before_its_first_forward(monkeypatch) -> None:
    """The cap (tests/unit/common/test_onednn.py) must be in the environment before the first rollout."""
    monkeypatch.delenv(PRIMITIVE_CACHE_ENV, raising=False)
    build_scorer(load_config("tests", []))
    assert os.environ[PRIMITIVE_CACHE_ENV] == str(PRIMITIVE_CACHE)


def test_the_worker_takes_the_method_resolved_by_launch(redis_server, run_id, monkeypatch) -> None:
    """``stage_parts`` resolves ``credit.method`` once and the worker keeps that spec (its settings
    and prover) for every group; without one it resolves it itself, once."""
    cfg = load_config("tests", [f"redis.url={redis_server.url}", f"run.name={run_id}", "credit.method=grpo"])
    spec = resolve_credit(cfg)
    monkeypatch.setattr(worker, "resolve_credit", lambda cfg: pytest.fail("resolved again"))
    red = Redistributor(cfg, "red0", credit=spec)
    assert red.credit is spec and red.scorer is None and red.sampler is None  # grpo needs neither
    monkeypatch.setattr(worker, "resolve_credit", resolve_credit)
    assert Redistributor(cfg, "red1").credit == spec


def test_a_method_that_reads_token_texts_gets_the_tokenizer_and_no_scorer(redis_server, run_id) -> None:
    """``oracle`` (``needs_tokenizer``) costs what grpo costs: no scorer model, only ``model.tokenizer``
    (else model.path's) loaded; grpo loads neither."""
    base = [f"redis.url={redis_server.url}", f"run.name={run_id}", f"model.tokenizer={qwen_tokenizer_dir()}"]
    oracle = Redistributor(load_config("tests", [*base, "credit.method=oracle", "task.settings.op=chain"]), "red0")
    assert oracle.scorer is None and oracle.tokenizer.decode([40]) == "I"
    grpo = Redistributor(load_config("tests", [*base, "credit.method=grpo"]), "red1")
    assert grpo.tokenizer is None and grpo.checker is None


def test_a_task_with_a_slip_checker_counts_where_each_wrong_trace_took_its_blame(
    redis_server, run_id, qwen_tok
) -> None:
    """On a chain task even grpo (no scorer) loads the tokenizer, and the worker counts each wrong
    trace whose first wrong line the checker names (here weighted by ``oracle``: blame on that line)."""
    cfg, lines, pid = chain(False, f"redis.url={redis_server.url}", f"run.name={run_id}", "credit.method=grpo")
    cfg.model.tokenizer = qwen_tokenizer_dir()
    red = Redistributor(cfg, "red0")
    assert red.scorer is None and red.checker is not None and red.checker.tokenizer is red.tokenizer
    wrong = [lines[0], slipped(lines[1]), *lines[2:]]
    group = group_of(qwen_tok, pid, [text(lines, "1", False), text(wrong, "0", False)], [1.0, 0.0])
    red._count(group, redistribute_group(group, chain()[0], tokenizer=qwen_tok).samples, 0.1)
    m = red.metrics
    assert (m.wrong_samples, m.slip_named, m.slip_top_blame) == (1, 1, 1.0)
    assert m.slip_top_chance == pytest.approx(1 / 3)


def test_a_trace_that_cannot_be_saved_is_one_warning_and_the_worker_goes_on(tmp_path, caplog) -> None:
    """A full disk under run.dir/traces: the traces serve the report, so the worker says so once and
    saves no more this run (an OSError used to end the worker, restarted into the same error)."""
    import logging
    from types import SimpleNamespace

    (tmp_path / "traces").write_text("a file where the folder goes: mkdir fails as on a full disk")
    cfg = load_config("tests", [f"run.dir={tmp_path}", "credit.save_traces=5"])
    me = SimpleNamespace(cfg=cfg, name="red0", saved=0)
    group = SimpleNamespace(group_id="g1", samples=[SimpleNamespace(advantage=0.5)])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            Redistributor._maybe_save(me, group, b"x", b"y")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"red0: could not save a trace in {tmp_path / 'traces'}") and me.saved == 5
