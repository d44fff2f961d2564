"""``rredcot study credit`` end to end at CI size: traces sampled by a real vLLM engine from the
tiny SFT'd model, every credit method (``progress`` with the same engine as its prover) and MC (the
same engine, seeded) on them, and the report."""

from __future__ import annotations

import json
import math

from rredcot.common.config import load_config
from rredcot.launch.study.command import credit_study

PNG = b"\x89PNG\r\n\x1a\n"


def test_study_credit_writes_the_report(tmp_path) -> None:
    cfg = load_config("tests", [f"run.dir={tmp_path}", "generation.group_size=6"])
    path = credit_study(cfg, "tests", "tiny-qwen3-arith", tmp_path / "study", problems=4, mc_samples=4)
    out = path.parent
    summary = json.loads((out / "study.json").read_text())
    assert summary["traces"] >= 2 and summary["checkpoint"] == "tiny-qwen3-arith" and summary["mc_samples"] == 4
    table = summary["by_sign"]["all"]
    methods = set(table["segment_rewards"])
    constructs = {"rredcot:solution", "rredcot:answer", "rredcot:suffix", "rredcot:suffix:w2"}
    assert constructs | {f"{c}+group" for c in constructs} | {"rredcot:sigma", "grpo", "entropy"} <= methods
    assert {"top_entropy", "progress"} <= methods
    assert set(summary["exit_values"]) == constructs
    for agreement in [*table["segment_rewards"].values(), *summary["exit_values"].values()]:
        for stat in agreement.values():
            assert stat["n"] + stat["excluded"] == summary["traces"]
            assert math.isnan(stat["mean"]) or -1 <= stat["mean"] <= 1
    assert set(table["paired_windows"]) == {"rredcot:suffix:w2", "rredcot:suffix:w2+group"}
    entropy_vs_itself = table["paired"]["entropy"]
    assert set(table["paired"]) == methods and (entropy_vs_itself["n"] == 0 or entropy_vs_itself["mean"] == 0)
    assert {t for t in summary["by_sign"]} <= {"all", "A>0", "A<0"} and len(summary["by_sign"]) >= 2
    assert sum(summary["by_sign"][s]["traces"] for s in ("A>0", "A<0") if s in summary["by_sign"]) == summary["traces"]
    half = table["half_agreement"]
    assert half["n"] + half["excluded"] == summary["traces"]
    assert summary["cost"]["mc"]["tokens"] > 0 and summary["cost"]["rredcot:suffix"]["tokens"] > 0
    # progress samples its prover's continuations: its cost is more than the entropy pass alone
    assert summary["cost"]["progress"]["tokens"] > summary["cost"]["entropy"]["tokens"]
    assert 0 <= summary["mc_stderr_mean"] <= 0.5 + 1e-9  # a mean of M rewards in {0, 1}
    assert set(summary["mc_std_by_m"]) == {"1", "2"}  # M = 4: subsets of 1 and 2 continuations
    report = path.read_text()
    assert "tiny-qwen3-arith" in report and "## Segment rewards vs MC" in report and "| grpo |" in report
    for png in ("correlation_by_position.png", "mc_std.png", "value_curves.png"):
        assert (out / png).read_bytes().startswith(PNG)
    assert "group 4/4" in (out / "study.log").read_text()
