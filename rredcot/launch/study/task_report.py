"""``rredcot study task CONFIG --lengths 2,4,8,16``: what a chain task gives credit to find, per
length, from the policy as it is (``model.path``): groups sampled as in training, each wrong trace's
first slip named by the task's checker.

Per length: accuracy; the slip rate of each line (a line wrong from its own operands, or no step at
all), per position and per kind of step; the share of wrong traces with exactly one slipped line; and
the share of (wrong trace, sibling) pairs whose texts are identical up to the start of the wrong
trace's first slip (there GRPO's group already tells the slip's line from the rest, as Monte Carlo
would)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from rredcot.common.config import Config, ConfigError
from rredcot.common.records import RolloutGroup
from rredcot.launch.study.traces import sample_traces, study_engine
from rredcot.tasks.data import Problem, train_and_held_out
from rredcot.tasks.task import Task, working
from rredcot.tasks.verifier import Verifier


def line_slips(task: Task, lines: list[str]) -> list[tuple[str, bool]]:
    """Each working line's kind (``?`` for a line that is no step) and whether it slipped."""
    out = []
    for line in lines:
        checked = task.checked_steps([line])
        out.append((checked[0][0], not checked[0][1]) if checked else ("?", True))
    return out


def length_report(task: Task, groups: list[RolloutGroup], problems: dict[str, Problem], tok: Any) -> dict[str, Any]:
    """The measures of one length from its sampled ``groups``."""
    per_line: dict[int, list[int]] = {}
    per_kind: dict[str, list[int]] = {}
    wrong = one_slip = shared = pairs = samples = 0
    for g in groups:
        problem = problems[g.samples[0].prompt_id]
        texts = [tok.decode(s.completion_ids, skip_special_tokens=True) for s in g.samples]
        for i, (s, text) in enumerate(zip(g.samples, texts)):
            samples += 1
            lines, starts = working(text)
            slips = line_slips(task, lines)
            for j, (kind, slipped) in enumerate(slips):
                for tally in (per_line.setdefault(j, [0, 0]), per_kind.setdefault(kind, [0, 0])):
                    tally[0] += slipped
                    tally[1] += 1
            if s.reward > 0:
                continue
            wrong += 1
            one_slip += sum(slipped for _, slipped in slips) == 1
            first = task.first_slip(problem, lines)
            if first is not None and first < len(lines):
                prefix = text[: starts[first]]
                for k, other in enumerate(texts):
                    if k != i:
                        pairs += 1
                        shared += other.startswith(prefix)
    return {
        "samples": samples,
        "accuracy": float(np.mean([s.reward for g in groups for s in g.samples])),
        "slip_rate_per_line": [per_line[j][0] / per_line[j][1] for j in sorted(per_line)],
        "slip_rate_per_kind": {k: v[0] / v[1] for k, v in sorted(per_kind.items())},
        "wrong": wrong,
        "exactly_one_slip": one_slip / wrong if wrong else float("nan"),
        "sibling_pairs": pairs,
        "sibling_prefix_shared": shared / pairs if pairs else float("nan"),
    }


def task_report(cfg: Config, lengths: list[int], n_problems: int, out: Path) -> Path:
    """Sample ``n_problems`` groups at each chain length (``task.settings.chain_steps``), write
    ``task.json`` and ``task.md`` under ``out``; returns the markdown's path."""
    if cfg.task.settings.get("op") != "chain":
        raise ConfigError(f"task.name = {cfg.task.name!r}: study task measures chains; expected task.settings.op=chain")
    engine = study_engine(cfg)
    found: dict[int, dict[str, Any]] = {}
    try:
        for n in lengths:
            settings = {**cfg.task.settings, "chain_steps": n}
            at = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, settings=settings))
            verifier = Verifier.from_config(at)
            if not verifier.task.checks_slips:
                raise ConfigError(f"task {cfg.task.name!r} has no slip checker: study task needs one")
            train, _ = train_and_held_out(verifier.task, at.data, at.run.seed)
            groups = sample_traces(at, engine, verifier, n_problems)
            found[n] = length_report(verifier.task, groups, {p.id: p for p in train}, engine.tokenizer)
    finally:
        engine.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "task.json").write_text(json.dumps(found, indent=1))
    path = out / "task.md"
    path.write_text("\n".join(task_table(found, cfg.model.path)) + "\n")
    return path


def task_table(found: dict[int, dict[str, Any]], model: str) -> list[str]:
    lines = [
        f"# What the chains give credit to find ({model}, sampled as in training)",
        "",
        "| steps | samples | accuracy | slip rate per kind | slip rate per line | wrong traces with one slip | "
        "sibling pairs sharing the prefix up to the slip |",
        "|---:|---:|---:|---|---|---:|---:|",
    ]
    for n, r in found.items():
        kinds = ", ".join(f"`{k}` {v:.3f}" for k, v in r["slip_rate_per_kind"].items())
        per_line = " ".join(f"{v:.2f}" for v in r["slip_rate_per_line"])
        lines.append(
            f"| {n} | {r['samples']} | {r['accuracy']:.3f} | {kinds} | {per_line} | {r['exactly_one_slip']:.3f} "
            f"(of {r['wrong']}) | {r['sibling_prefix_shared']:.3f} (of {r['sibling_pairs']}) |"
        )
    return lines
