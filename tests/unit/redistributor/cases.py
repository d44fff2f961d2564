"""Realistic groups for the credit and heatmap tests (real Qwen3 token ids)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rredcot.common.config import CreditConfig, SegmentationConfig
from rredcot.common.records import RolloutGroup, RolloutRecord, new_id

TRACES = [
    "<think>\nFirst, 12*7 = 70 + 14. So it is 84.\nWait, check: 7*12 = 84. Yes.\n</think>\n\nAnswer: 84",
    "<think>\nHmm, 12*7. Let me add 12 seven times: 12, 24, 36, 48, 60, 72, 84.\nSo 84.\n</think>\n\nAnswer: 84",
    "<think>\nI think 12*7 = 74.\nTherefore 74.\n</think>\n\nAnswer: 74",
    "12*7 is 84",  # no thinking tags: the whole completion is segmented
]


def credit_config(method: str = "rredcot", segmentation: dict[str, Any] | None = None, **settings: Any) -> CreditConfig:
    """``credit.method`` with ``settings`` as its block (``credit.settings.<method>``) and the
    ``segmentation`` keys given (the rest: defaults)."""
    blocks = {method: settings} if settings else {}
    return CreditConfig(method=method, segmentation=SegmentationConfig(**(segmentation or {})), settings=blocks)


def make_group(tok, traces=TRACES, rewards=(1.0, 1.0, 0.0, 1.0), refs=True, finish="stop") -> RolloutGroup:
    gid = new_id()
    samples = []
    for i, (text, r) in enumerate(zip(traces, rewards)):
        ids = np.array(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
        samples.append(
            RolloutRecord(
                new_id(),
                gid,
                "p0",
                i,
                ids,
                np.zeros(len(ids), np.float32),
                np.array([[0, 0]], np.int32),
                finish,
                r,
                "correct" if r > 0 else "wrong",
            )
        )
    enc = lambda t: np.array(tok(t, add_special_tokens=False)["input_ids"], dtype=np.int32)  # noqa: E731
    return RolloutGroup(
        gid,
        "p0",
        enc("<|im_start|>user\nWhat is 12*7?<|im_end|>\n<|im_start|>assistant\n"),
        [enc("12*7 = 84.\n")] if refs else [],
        [enc("Answer: 84")] if refs else [],
        samples,
        answer="84",
    )
