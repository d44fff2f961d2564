"""Credit quality without Monte Carlo: does a credit method blame the line where a chain goes wrong?

On the chain task (four lines of working, then the answer) a checker knows the first wrong line of
a trace (``tasks.chain.first_slip``). For every credit method and value construct, on the same
groups and one scorer (the config's policy), the σ mass of each working line of each trace:
- **constructed** groups (the first ``--problems`` training problems): the correct chain, the correct
  chain with an irrelevant line inserted, and a slip at each line carried forward (``rredcot/launch/study/slips``);
- **sampled** groups (``--sampled`` problems × ``generation.group_size``, T as in training, by a vLLM
  engine holding the policy): every wrong trace the checker can blame on a working line.
Scores per wrong trace: top-1 (the most blamed line is the slip), blame share on the slip line,
Spearman with the slip indicator; per constructed correct trace, the share of credit on the lines
the answer depends on (not the filler). Means with 95% intervals clustered by group. Last line: JSON
(``rredcot_*`` is the config's own rredcot settings; ``chance`` the top-1 of a random line;
``*_scorer_tokens_per_sample`` what each construct forwarded through the scorer, trace and branches).

    rredcot bench credit_quality [--config study_cpu] [--problems 8] [--sampled 16]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import numpy as np  # noqa: E402

from rredcot.common.codec import encode  # noqa: E402
from rredcot.common.config import Config, load_config  # noqa: E402
from rredcot.common.precision import cpu_info  # noqa: E402
from rredcot.common.records import RolloutGroup  # noqa: E402
from rredcot.launch.arguments import bounded_int  # noqa: E402
from rredcot.launch.study.credit import (  # noqa: E402
    STUDY_WINDOWS,
    construct_name,
    rredcot_settings,
    rredcot_variants,
    with_method,
)
from rredcot.launch.study.slips import (  # noqa: E402
    Format,
    LabelledTrace,
    constructed_group,
    dependency_share,
    label_sampled,
    slip_scores,
)
from rredcot.launch.study.stats import Interval, clustered_interval  # noqa: E402
from rredcot.redistributor.credit import redistribute_group  # noqa: E402
from rredcot.redistributor.lines import line_mass  # noqa: E402
from rredcot.redistributor.scorer import Scorer  # noqa: E402
from rredcot.redistributor.worker import build_scorer  # noqa: E402
from rredcot.tasks.data import train_and_held_out  # noqa: E402
from rredcot.tasks.task import build_task  # noqa: E402
from rredcot.tasks.verifier import Verifier  # noqa: E402


def group_sigmas(
    group: RolloutGroup, cfg: Config, scorer: Scorer
) -> tuple[dict[str, list[np.ndarray]], dict[str, int]]:
    """Every sample's σ under each method, and under RREDCoT for each construct × baseline (the suffix
    at every start and at ``STUDY_WINDOWS`` too, whatever the config's own window); and the tokens per
    sample each construct forwarded through the scorer (its trace pass and its branches)."""
    out = {}
    for m in ("grpo", "entropy", "top_entropy"):
        out[m] = [w.sigma for w in redistribute_group(group, with_method(cfg, m, keep=False), scorer).samples]
    tokens = {}
    for name, (credits, cost) in rredcot_variants(group, cfg, scorer, STUDY_WINDOWS).items():
        construct, _, baseline = name.partition("+")
        out[f"rredcot_{construct}_{baseline or 'none'}"] = [c.sigma for c in credits]
        tokens[f"rredcot_{construct}"] = cost.tokens
    own = rredcot_settings(cfg)
    own_row = construct_name(own.reference, own.suffix_window)  # not the loop's last ``name``
    out["rredcot"] = out[f"rredcot_{own_row}_{own.baseline}"]  # the config's own
    tokens["rredcot"] = tokens[f"rredcot_{own_row}"]
    return out, tokens


def score(sigmas: list[list[np.ndarray]], labels: list[list[LabelledTrace]]) -> dict[str, Interval]:
    """Slip scores of one method's σ over labelled groups, each clustered by group."""
    cols: dict[str, list[float]] = {k: [] for k in ("top1", "blame", "rho", "dep", "chance")}
    slip_of: list[int] = []
    dep_of: list[int] = []
    for g, (group_sigma, group_labels) in enumerate(zip(sigmas, labels, strict=True)):
        for lab in group_labels:
            mass = line_mass(group_sigma[lab.sample], lab.lines)
            if lab.slip is not None:
                hit, share, rho = slip_scores(mass, lab.slip)
                cols["top1"].append(hit)
                cols["blame"].append(share)
                cols["rho"].append(rho)
                cols["chance"].append(1.0 / len(lab.lines))
                slip_of.append(g)
            elif lab.filler is not None:
                cols["dep"].append(dependency_share(mass, lab.filler))
                dep_of.append(g)
    return {k: clustered_interval(v, dep_of if k == "dep" else slip_of) for k, v in cols.items()}


def constructed(cfg: Config, tok: object, fmt: Format, n: int) -> tuple[list[RolloutGroup], list[list[LabelledTrace]]]:
    task = build_task(cfg.task)
    train = train_and_held_out(task, cfg.data, cfg.run.seed)[0][:n]
    rng = np.random.default_rng(0)
    built = [constructed_group(i, p, task, cfg.data, tok, fmt, rng) for i, p in enumerate(train)]
    return [g for g, _ in built], [labels for _, labels in built]


def sampled(cfg: Config, tok: object, fmt: Format, n: int) -> tuple[list[RolloutGroup], list[list[LabelledTrace]]]:
    from rredcot.launch.study.traces import sample_traces, study_engine

    engine = study_engine(cfg)
    try:
        with Verifier.from_config(cfg) as verifier:
            groups = sample_traces(cfg, engine, verifier, n)
            problems = train_and_held_out(verifier.task, cfg.data, cfg.run.seed)[0][:n]
    finally:
        engine.close()
    mixed = [(g, p) for g, p in zip(groups, problems, strict=True) if len({s.reward for s in g.samples}) > 1]
    labels = [label_sampled(i, g, p, tok, fmt) for i, (g, p) in enumerate(mixed)]
    return [g for g, _ in mixed], [[lab for lab in ls if lab.slip is not None] for ls in labels]


def _cell(iv: Interval) -> str:
    return f"{iv.mean:.2f} [{iv.low:.2f}, {iv.high:.2f}]" if iv.n else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="study_cpu")
    parser.add_argument(
        "--problems", type=bounded_int(1, 10**6), default=8, help="constructed groups (one per problem)"
    )
    parser.add_argument(
        "--sampled", type=bounded_int(0, 10**6), default=16, help="problems sampled from the policy (0: none)"
    )
    parser.add_argument(
        "--save",
        default=None,
        help="write the first constructed group under the config's rredcot here "
        "(an encoded WeightedGroup: `rredcot inspect FILE --index I` draws its heatmap)",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args()
    start = time.perf_counter()
    cfg = load_config(args.config, args.overrides)
    available = len(train_and_held_out(build_task(cfg.task), cfg.data, cfg.run.seed)[0])
    for flag, wanted in (("--problems", args.problems), ("--sampled", args.sampled)):
        if wanted > available:  # they take the first training problems: fewer would pass silently
            parser.error(f"{flag} {wanted} is more than the {available} training problems of config {args.config}")
    scorer = build_scorer(cfg)
    fmt = Format(cfg.model.think_start, cfg.model.think_end, scorer.answer_template)
    sources = {"constructed": constructed(cfg, scorer.tokenizer, fmt, args.problems)}
    if args.sampled:
        sources["sampled"] = sampled(cfg, scorer.tokenizer, fmt, args.sampled)
    if args.save:
        first = sources["constructed"][0][0]
        Path(args.save).write_bytes(encode(redistribute_group(first, cfg, scorer)))
    scored = {src: [group_sigmas(g, cfg, scorer) for g in groups] for src, (groups, _) in sources.items()}
    per_group = {src: [sigmas for sigmas, _ in groups] for src, groups in scored.items()}
    every = [t for groups in scored.values() for _, t in groups]
    tokens = {k: round(float(np.mean([t[k] for t in every]))) for k in every[0]}  # per sample
    results = {
        name: {src: score([gs[name] for gs in per_group[src]], sources[src][1]) for src in sources}
        for name in per_group["constructed"][0]
    }
    c = rredcot_settings(cfg)
    print(f"CPU: {cpu_info().describe()}; config {args.config}; policy and scorer {cfg.model.path}")
    print(
        f"rredcot = {c.reference} construct (at most {c.max_suffixes} suffixes, window {c.suffix_window or 'all'}), "
        f"baseline {c.baseline}, {c.value_space} values, λ = {c.uniform_mix}, "
        f"{cfg.credit.segmentation.segments} segments; scorer tokens per sample {tokens['rredcot']:,}"
    )
    counts = {src: results["grpo"][src]["top1"].n for src in sources}
    print("wrong traces blamed on a line: " + ", ".join(f"{src} {n}" for src, n in counts.items()))
    head = f"{'method':<24}" + "".join(f" {src + ' ' + k:>24}" for src in sources for k in ("top1", "blame", "rho"))
    print(head + f" {'dependency share':>24}")
    for name, by_src in results.items():
        row = "".join(f" {_cell(by_src[src][k]):>24}" for src in sources for k in ("top1", "blame", "rho"))
        print(f"{name:<24}{row} {_cell(by_src['constructed']['dep']):>24}")
    print(f"{'chance':<24}" + "".join(f" {_cell(results['grpo'][src]['chance']):>24}{'':>50}" for src in sources))
    out: dict[str, object] = {"config": args.config, "cpu": cpu_info().describe()}
    for name, by_src in results.items():
        for src, scores in by_src.items():
            tag = "" if src == "constructed" else "_sampled"
            for k, key in (("top1", "slip_top1"), ("blame", "slip_blame"), ("rho", "slip_rho")):
                out[f"{name}_{key}{tag}"] = round(scores[k].mean, 4)
        out[f"{name}_dependency_share"] = round(by_src["constructed"]["dep"].mean, 4)
    for src in sources:
        out["chance" + ("" if src == "constructed" else "_sampled")] = round(results["grpo"][src]["chance"].mean, 4)
        out["traces" + ("" if src == "constructed" else "_sampled")] = counts[src]
    out |= {f"{name}_scorer_tokens_per_sample": n for name, n in tokens.items()}
    out["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
