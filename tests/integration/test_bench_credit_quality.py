"""``bench/credit_quality.py`` end to end at CI size: one constructed chain group on the tiny model,
every method scored, and the JSON line a user compares runs by (a crash in its summary once went
unnoticed because nothing ran its ``main``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHAIN = ["task.settings.op=chain", "task.settings.chain_steps=4", "task.settings.operand_min=1"]


def test_the_slip_bench_scores_every_method_and_prints_its_json_line() -> None:
    args = ["--config", "tests", "--problems", "1", "--sampled", "0", *CHAIN, "task.settings.operand_max=5"]
    out = subprocess.run(
        [
            sys.executable,
            "-P",
            str(ROOT / "bench" / "credit_quality.py"),
            *args,
            "credit.settings.rredcot.suffix_window=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["traces"] == 4 and result["chance"] == 0.25  # one slip at each of the chain's 4 lines
    methods = ("grpo", "entropy", "top_entropy", "rredcot", "rredcot_suffix_group", "rredcot_suffix:w2_group")
    for method in (*methods, "rredcot_answer_none"):  # the suffix at every start beside the config's window
        assert 0 <= result[f"{method}_slip_top1"] <= 1 and 0 <= result[f"{method}_slip_blame"] <= 1
    tokens = {c: result[f"rredcot_{c}_scorer_tokens_per_sample"] for c in ("answer", "solution", "suffix:w2", "suffix")}
    assert 0 < tokens["answer"] < tokens["solution"] and tokens["suffix:w2"] < tokens["suffix"]
    assert tokens["suffix:w2"] == result["rredcot_scorer_tokens_per_sample"]
    assert "window 2" in out
