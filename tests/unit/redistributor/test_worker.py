"""Worker pieces that need no Redis: the MC reward function and the metrics snapshot."""

from __future__ import annotations

from rredcot.common.config import TaskConfig
from rredcot.common.verifier import Verifier
from rredcot.redistributor.worker import WorkerMetrics, verifier_reward


def test_verifier_reward_on_real_tokens(qwen_tok) -> None:
    verifier = Verifier(TaskConfig("math"))
    reward = verifier_reward(verifier, qwen_tok)
    enc = lambda t: qwen_tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert reward(enc("<think>\n12*7 = 84\n</think>\n\nAnswer: 84"), "84") == 1.0
    assert reward(enc("So the result is \\boxed{\\frac{168}{2}}"), "84") == 1.0
    assert reward(enc("Answer: 85"), "84") == 0.0
    assert reward(enc("I am not sure"), "84") == 0.0
    verifier.close()


def test_metrics_rates() -> None:
    m = WorkerMetrics(rollouts=8, tokens=400, busy_s=2.0)
    snap = m.snapshot()
    assert snap["rollouts_per_s"] == 4.0 and snap["tokens_per_s"] == 200.0
    assert WorkerMetrics().snapshot()["tokens_per_s"] == 0.0
