"""Generation benchmark: the generator actor's loop vs plain ``LLM.generate``, and weight-update cost.

For a tiny and a ~25M-parameter random Qwen3 (real Qwen3 tokenizer), in one process and one run:
plain ``LLM.generate`` tokens/s on the run's first prompts and the generator loop's tokens/s on the
same prompts (engine steps + verification + Redis writes, wall clock), interleaved, best of
``--repeats``; the time of one weight update (safetensors bytes through the worker extension, best
of 3) and of one generation step (``prompts_per_step`` groups). Last line: one JSON object.

    rredcot bench generation [--prompts 8] [--group 4] [--max-tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from safetensors.torch import save  # noqa: E402

from rredcot.actors.engine import Engine, EngineSpec, Sampling  # noqa: E402
from rredcot.actors.generator import Generator  # noqa: E402
from rredcot.common.config import Config, load_config  # noqa: E402
from rredcot.launch.arguments import bounded_int  # noqa: E402
from rredcot.launch.services import EmbeddedRedis  # noqa: E402
from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir, save_model_dir  # noqa: E402
from rredcot.models.tiny import build_tiny_model  # noqa: E402
from rredcot.tasks.data import ProblemOrder, train_and_held_out  # noqa: E402
from rredcot.tasks.prompts import prompt_ids  # noqa: E402
from rredcot.tasks.task import build_task  # noqa: E402
from rredcot.transports.file import apply_bytes

MODELS = {"tiny": {"hidden": 64, "heads": 2, "layers": 2}, "25M": {"hidden": 160, "heads": 5, "layers": 4}}


def plain_tokens_per_s(engine: Engine, prompts: list[list[int]], sampling: Sampling) -> float:
    from vllm import SamplingParams  # the benchmark's baseline is vLLM itself, used directly

    params = SamplingParams(
        n=sampling.n, temperature=sampling.temperature, max_tokens=sampling.max_tokens, logprobs=0, detokenize=False
    )  # as the actor's requests
    start = time.perf_counter()
    outs = engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return sum(len(c.token_ids) for o in outs for c in o.outputs) / seconds


def actor_tokens_per_s(engine: Engine, cfg: Config) -> float:
    """The generator loop over the run's budget (prompts 0..N-1), wall clock incl. verify and XADD."""
    gen = Generator(cfg, "bench", engine=engine)
    gen.verifier.score("Answer: 1", "1")  # start the verifier process before timing
    tokens, start = engine.generated_tokens, time.perf_counter()
    metrics = gen.run(timeout_s=900, linger=False)  # no learner here
    seconds = time.perf_counter() - start
    gen.close()
    assert metrics["finished_groups"] == cfg.generation.prompts_per_step, metrics
    return (engine.generated_tokens - tokens) / seconds


def bench_model(label: str, root: Path, url: str, args: argparse.Namespace) -> dict[str, float]:
    tok = load_tokenizer(qwen_tokenizer_dir())
    model = build_tiny_model("qwen3", seed=0, **MODELS[label])
    params = sum(p.numel() for p in model.parameters())
    path = str(save_model_dir(model, tok, root / label))
    cfgs = [
        load_config(
            "tests",
            [
                f"model.path={path}",
                f"redis.url={url}",
                f"run.name=bench-{label}-{r}",
                "run.steps=1",
                f"generation.prompts_per_step={args.prompts}",
                f"generation.group_size={args.group}",
                f"generation.max_tokens={args.max_tokens}",
                f"generation.max_in_flight_groups={args.prompts}",
                "staleness.eta=0",
                "redis.maxlen=100000",
            ],
        )
        for r in range(args.repeats)
    ]
    cfg = cfgs[0]
    engine = Engine(EngineSpec.from_config(cfg))
    task = build_task(cfg.task)
    order = ProblemOrder(train_and_held_out(task, cfg.data, cfg.run.seed)[0], cfg.data.shuffle_seed)
    prompts = [prompt_ids(order.at(i), task, cfg.data, engine.tokenizer) for i in range(args.prompts)]
    sampling = Sampling(n=args.group, temperature=cfg.generation.temperature, max_tokens=args.max_tokens)
    plain_tokens_per_s(engine, prompts, sampling)  # warm-up: the first large batch is slow
    plain, actor = [], []
    for i, c in enumerate(cfgs):  # interleaved in alternating order, best of each: other jobs share the cores
        for path in ("plain", "actor")[:: 1 if i % 2 == 0 else -1]:
            if path == "plain":
                plain.append(plain_tokens_per_s(engine, prompts, sampling))
            else:
                actor.append(actor_tokens_per_s(engine, c))

    weights = save({k: v.detach().contiguous() for k, v in model.named_parameters()})
    apply_bytes(engine, weights, version=1)  # warm-up
    update_s = min(apply_bytes(engine, weights, version=v) for v in (2, 3, 4))
    start = time.perf_counter()
    engine.generate(prompts, sampling, prefix="step")
    step_s = time.perf_counter() - start
    return {
        "params": params,
        "plain_tok_s": max(plain),
        "actor_tok_s": max(actor),
        "actor_vs_plain": max(actor) / max(plain),
        "update_s": update_s,
        "step_s": step_s,
        "update_vs_step": update_s / step_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=bounded_int(1, 10**6), default=8, help="groups per step (one step = all)")
    p.add_argument("--group", type=bounded_int(1, 10**4), default=4)
    p.add_argument("--max-tokens", type=bounded_int(1, 10**7), default=64)
    p.add_argument("--repeats", type=bounded_int(1, 10**6), default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as redis_server:
        rows = {label: bench_model(label, Path(tmp), redis_server.url, args) for label in MODELS}
    print(
        f"{'model':>6} {'params':>11} {'plain tok/s':>12} {'actor tok/s':>12} {'actor/plain':>12} "
        f"{'update s':>9} {'step s':>8} {'update/step':>12}"
    )
    for label, r in rows.items():
        print(
            f"{label:>6} {r['params']:>11,} {r['plain_tok_s']:>12.0f} {r['actor_tok_s']:>12.0f} "
            f"{r['actor_vs_plain']:>12.3f} {r['update_s']:>9.3f} {r['step_s']:>8.3f} {r['update_vs_step']:>12.3f}"
        )
    summary = {
        "actor_vs_plain": rows["25M"]["actor_vs_plain"],
        "update_vs_step": rows["25M"]["update_vs_step"],
        "actor_vs_plain_tiny": rows["tiny"]["actor_vs_plain"],
        "update_vs_step_tiny": rows["tiny"]["update_vs_step"],
        "update_s_tiny": rows["tiny"]["update_s"],
        "update_s_25M": rows["25M"]["update_s"],
        "params_25M": rows["25M"]["params"],
        "config": {
            "prompts": args.prompts,
            "group": args.group,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
