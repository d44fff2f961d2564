"""The ``rredcot`` command line: train the whole pipeline, run one stage alone, inspect, benchmark."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import runpy
import sys
from collections.abc import Callable
from pathlib import Path

from rredcot.common.config import Config, available_configs, load_config, redacted, to_yaml
from rredcot.common.errors import UserError
from rredcot.common.streams import REDIS_WAIT_S, wait_for_redis
from rredcot.launch.arguments import bounded_float, bounded_int
from rredcot.launch.observe.logs import WorkerFailed, headline, own_error

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: bench/ is beside the package
ADVISE_MAX_UNITS = 100_000  # GPUs (or workers) ``advise`` splits: a cluster's, as the config's worker counts

# subcommand -> (module, function taking a Config, help)
STAGES: dict[str, tuple[str, str, str]] = {
    "train": ("rredcot.launch.driver", "train", "run the whole asynchronous pipeline on Ray"),
    "generate": ("rredcot.launch.stages", "run_stage", "run one generator actor against redis.url"),
    "redistribute": ("rredcot.launch.stages", "run_stage", "run one redistributor worker against redis.url"),
    "learn": ("rredcot.launch.stages", "run_stage", "run the learner against redis.url"),
}
STAGE_TIERS = {"generate": "generator", "redistribute": "redistributor", "learn": "learner"}


def _add_debug(p: argparse.ArgumentParser) -> None:
    # also after the subcommand (``rredcot train cfg --debug``); SUPPRESS keeps the global flag's value
    p.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error"
    )


def _add_overrides(p: argparse.ArgumentParser, help_text: str) -> None:
    # default=[]: not listed as required when missing; those after a flag are collected by parse_args
    p.add_argument("overrides", nargs="*", default=[], help=help_text)


def _add_config_args(p: argparse.ArgumentParser) -> None:
    _add_debug(p)
    p.add_argument("config", help=f"YAML file or bundled config name ({', '.join(available_configs())})")
    _add_overrides(p, "dotlist overrides, e.g. learner.lr=1e-6 cluster.generators=4 (also after flags)")


def benchmarks() -> list[str]:
    """The runnable benchmarks: ``bench/*.py`` with a ``__main__`` entry (not a helper such as ``trend``),
    less the implementations whose ``main`` another benchmark runs (``queue`` runs ``stream_queue``'s)."""
    texts = {p.stem: p.read_text(encoding="utf-8") for p in (REPO_ROOT / "bench").glob("*.py")}
    run_by_others = {m for t in texts.values() for m in re.findall(r"from\s+(?:bench\.)?(\w+)\s+import\s+main\b", t)}
    return sorted(name for name, t in texts.items() if '__name__ == "__main__"' in t and name not in run_by_others)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rredcot", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, _, help_text) in STAGES.items():
        _add_config_args(stage := sub.add_parser(name, help=help_text))
        if name == "train":
            stage.add_argument(
                "--verbose",
                action="store_true",
                help="also show other libraries' (vLLM, Ray, DeepSpeed) log lines on the console",
            )
        elif name in ("generate", "redistribute"):
            prefix, count = ("gen", "generators") if name == "generate" else ("red", "redistributors")
            stage.add_argument(
                "--index",
                type=int,
                default=0,
                metavar="N",
                help=f"this worker's name {prefix}<N>"
                + (" and rank N" if name == "generate" else "")
                + f" (default 0); to add one to a run, N >= cluster.{count}, the driver's being 0..cluster.{count}-1",
            )
    _add_debug(doctor := sub.add_parser("doctor", help="check this machine (and a config's needs) and say what to fix"))
    doctor.add_argument("config", nargs="?", default="demo_cpu", help="config to check against (default: demo_cpu)")
    _add_overrides(doctor, "dotlist overrides")
    _add_debug(config := sub.add_parser("config", help="show the resolved config"))
    config_sub = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    _add_config_args(show := config_sub.add_parser("show", help="print the resolved, validated config as YAML"))
    show.add_argument(
        "--check", action="store_true", help="also run the checks `train` runs before it starts (paths, data, services)"
    )
    _add_debug(config_sub.add_parser("list", help="list the bundled configs"))
    _add_debug(inspect := sub.add_parser("inspect", help="render a credit heatmap (HTML + PNG) of a weighted sample"))
    inspect.add_argument("source", help="a saved .msgpack record, or a redis:// URL to read the batches stream")
    inspect.add_argument("--run", default=None, help="run id (stream namespace) when reading from Redis")
    inspect.add_argument(
        "--tokenizer", default=None, help="the model's tokenizer directory (default: the builtin Qwen3 tokenizer)"
    )
    inspect.add_argument("--out", default="credit_heatmap", help="output path prefix")
    inspect.add_argument("--index", type=int, default=0, help="which sample of the group")
    _add_debug(report := sub.add_parser("report", help="redraw a run's curves and timeline (finished or running)"))
    report.add_argument("run_dir", help="the run's directory (run.dir)")
    _add_debug(advise := sub.add_parser("advise", help="predict samples/s per generator:redistributor:learner split"))
    advise.add_argument("run_dir", nargs="?", help="a run to take the per-tier rates from (its report/metrics.jsonl)")
    advise.add_argument(
        "--total",
        type=bounded_int(2, ADVISE_MAX_UNITS),
        default=None,
        help="GPUs (or CPU workers) to split; default: the run's",
    )
    advise.add_argument(
        "--params", type=bounded_float(0, 1e15, lo_open=True), help="without a run: parameters of the model (e.g. 4e9)"
    )
    advise.add_argument("--layers", type=bounded_int(1, 100_000), help="its layers")
    advise.add_argument("--heads", type=bounded_int(1, 100_000), help="its query heads")
    advise.add_argument("--kv-heads", type=bounded_int(1, 100_000), help="its key-value heads")
    advise.add_argument("--head-dim", type=bounded_int(1, 65_536), default=128, help="its head dimension (128)")
    advise.add_argument("--prompt", type=bounded_int(1, 10**8), default=512, help="prompt tokens (512)")
    advise.add_argument(
        "--completion", type=bounded_int(1, 10**8), default=25000, help="mean completion tokens (25000)"
    )
    advise.add_argument(
        "--scored",
        type=bounded_float(0, 1e12),
        default=0.0,
        help="extra tokens the scorer runs per sample (0: GRPO)",
    )
    advise.add_argument("--sync", action="store_true", help="staleness.eta = 0: generation and training alternate")
    advise.add_argument(
        "--cores",
        type=bounded_float(0, 10**7),
        default=None,
        help="cores the workers share (a CPU run: this machine's; 0: each unit has its own device)",
    )
    _add_debug(study := sub.add_parser("study", help="measure credit methods (docs/study.md)"))
    study_sub = study.add_subparsers(dest="action", required=True, metavar="ACTION")
    _add_config_args(credit := study_sub.add_parser("credit", help="every credit method against MC on a policy"))
    credit.add_argument("--checkpoint", default=None, help="the policy: an HF directory (default: model.path)")
    credit.add_argument("--traces", default=None, help="a run's traces/ folder (default: sample --problems groups)")
    credit.add_argument("--problems", type=int, default=16, help="groups to sample when --traces is not given")
    credit.add_argument("--mc-samples", type=int, default=16, help="MC continuations per exit point")
    credit.add_argument("--out", default=None, help="report folder (default: <run.dir>/study)")
    _add_config_args(compare := study_sub.add_parser("compare", help="train once per (method, seed); curves, paired"))
    compare.add_argument(
        "--methods",
        default="grpo,rredcot",
        help="comma-separated arms: a credit method, or METHOD@key=value[@...] (first: baseline)",
    )
    compare.add_argument("--seeds", type=int, default=3, help="sampling seeds per method (run.sampling_seed 1..N)")
    compare.add_argument("--out", default=None, help="report folder (default: runs/compare-<run.name>)")
    compare.add_argument(
        "--keep-checkpoints", action="store_true", help="keep each finished run's optimizer state (GBs per run)"
    )
    _add_config_args(task := study_sub.add_parser("task", help="what a chain task gives credit to find, per length"))
    task.add_argument("--lengths", default="2,4,8,16", help="comma-separated chain lengths (task.settings.chain_steps)")
    task.add_argument("--problems", type=bounded_int(1, 10**5), default=32, help="groups sampled per length")
    task.add_argument("--out", default=None, help="report folder (default: <run.dir>/task)")
    _add_debug(bench := sub.add_parser("bench", help="run a benchmark from bench/ (prints a table and a JSON line)"))
    bench.add_argument("name", help=" | ".join(benchmarks()) or "none here: run from a source checkout")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments (--debug is rredcot's)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line; overrides may also follow flags (``train cfg --verbose run.steps=1``):
    argparse fills a ``nargs="*"`` positional only up to the first flag, so the rest come back here."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "bench" and "--debug" in args.args:  # ``bench NAME ... --debug``: ours, not the script's
        args.args, args.debug = [a for a in args.args if a != "--debug"], True
    if args.command == "doctor" and "=" in args.config:  # ``doctor run.steps=1``: an override, not a config
        args.overrides, args.config = [args.config, *args.overrides], "demo_cpu"
    if extra and hasattr(args, "overrides") and not any(a.startswith("-") for a in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _call_stage(module: str, func: str, cfg: Config, **options: object) -> int:
    fn: Callable[..., object] = getattr(importlib.import_module(module), func)
    fn(cfg, **options)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command in STAGES:
            module, func, _ = STAGES[args.command]
            cfg = load_config(args.config, args.overrides)
            options = _stage_options(args, cfg)
            if args.command != "train" and cfg.redis.url:  # a stage alone: say at once that its Redis is not up
                wait_for_redis(cfg.redis.url, REDIS_WAIT_S, lambda line: print(f"rredcot: {line}", file=sys.stderr))
            return _call_stage(module, func, cfg, **options)
        if args.command == "doctor":
            from rredcot.launch.checks.doctor import doctor

            return doctor(load_config(args.config, args.overrides))
        if args.command == "config":
            if args.action == "list":
                print("\n".join(available_configs()))
                return 0
            cfg = load_config(args.config, args.overrides)
            print(to_yaml(redacted(cfg)), end="")
            if args.check:
                from rredcot.launch.checks.doctor import preflight

                for warning in preflight(cfg):
                    print(warning.line(), file=sys.stderr)
            return 0
        if args.command == "inspect":
            return _call_inspect(args)
        if args.command == "report":
            return _call_report(Path(args.run_dir))
        if args.command == "advise":
            from rredcot.launch.observe.advise_command import advise_command

            return advise_command(args)
        if args.command == "study":
            return _call_study(args)
        return _run_bench(args.name, args.args)
    except KeyboardInterrupt:
        print("rredcot: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        print(f"rredcot: {one_line(e)}", file=sys.stderr)
        return 2 if isinstance(shown_error(e), UserError) else 1


def _stage_options(args: argparse.Namespace, cfg: Config) -> dict[str, object]:
    """What a stage's function takes beyond the config."""
    if args.command == "train":
        from rredcot.launch.driver import lead_own_process_group

        lead_own_process_group(cfg)
        return {"verbose": args.verbose}
    if args.command == "learn":  # one rank, or launched per rank with RANK and WORLD_SIZE
        return {"tier": "learner", "rank": int(os.environ.get("RANK", "0"))}
    if args.index < 0:
        raise UserError(f"--index must be >= 0 (got {args.index})")
    return {"tier": STAGE_TIERS[args.command], "rank": args.index}


def shown_error(e: BaseException) -> BaseException:
    """The exception whose kind decides the label and the exit code: a failed worker's own error,
    or the one Ray wraps (``RayTaskError.cause``)."""
    return e.error if isinstance(e, WorkerFailed) else own_error(e)


def one_line(e: BaseException) -> str:
    """An error as the one line the user sees: a ``UserError``'s message, a failed worker's name, error
    and log, or any other error's type and first line with where the full story is."""
    shown = shown_error(e)
    if isinstance(e, WorkerFailed):
        return f"{shown.label if isinstance(shown, UserError) else 'failed'}: {e}"
    if isinstance(shown, UserError):
        return f"{shown.label}: {shown}"
    where = "a run's logs are in <run.dir>/logs; rerun with --debug for the traceback"
    return f"failed: {type(shown).__name__}: {headline(shown)} ({where})"


def _call_inspect(args: argparse.Namespace) -> int:
    from rredcot.redistributor.heatmap import inspect_command

    return int(inspect_command(args) or 0)


def _call_report(run_dir: Path) -> int:
    from rredcot.launch.observe.report import redraw

    try:
        files, verdict = redraw(run_dir)
    except FileNotFoundError as e:
        raise UserError(str(e)) from None
    print(f"rredcot: {verdict}")
    for f in files:
        print(f"rredcot: drew {f}")
    return 0


def _call_study(args: argparse.Namespace) -> int:
    from rredcot.launch.study.command import credit_study

    cfg = load_config(args.config, args.overrides)
    if args.action == "compare":
        return _call_compare(args, cfg)
    if args.action == "task":
        return _call_task(args, cfg)
    if args.mc_samples < 2 or args.problems < 1:
        raise UserError(f"--mc-samples must be >= 2 (got {args.mc_samples}) and --problems >= 1 (got {args.problems})")
    from rredcot.launch.checks.inputs import check_model

    policy = check_model("--checkpoint" if args.checkpoint else "model.path", args.checkpoint or cfg.model.path)
    if policy.level == "error":  # before any engine: Hugging Face's own text names no key
        raise UserError(f"{policy.found} -> {policy.fix}")
    path = credit_study(
        cfg,
        args.config,
        args.checkpoint or cfg.model.path,
        Path(args.out) if args.out else Path(cfg.run.dir) / "study",
        Path(args.traces) if args.traces else None,
        args.problems,
        args.mc_samples,
    )
    print(f"rredcot: study report {path}")
    return 0


def _call_task(args: argparse.Namespace, cfg: Config) -> int:
    from rredcot.launch.study.task_report import task_report

    try:
        lengths = [int(n) for n in args.lengths.split(",") if n]
    except ValueError:
        lengths = []
    if not lengths or any(not 1 <= n <= 16 for n in lengths):
        raise UserError(f"--lengths {args.lengths!r}: expected comma-separated chain lengths in [1, 16], e.g. 2,4,8,16")
    report = task_report(cfg, lengths, args.problems, Path(args.out) if args.out else Path(cfg.run.dir) / "task")
    print(f"rredcot: task report {report}")
    return 0


def _call_compare(args: argparse.Namespace, cfg: Config) -> int:
    from rredcot.launch.study.compare import compare_study

    methods = [m for m in args.methods.split(",") if m]
    if len(methods) < 2 or args.seeds < 1:
        raise UserError(
            f"--methods needs two or more methods (got {args.methods!r}) and --seeds >= 1 (got {args.seeds})"
        )
    out = Path(args.out) if args.out else Path("runs") / f"compare-{cfg.run.name}"
    report = compare_study(args.config, args.overrides, methods, args.seeds, out, args.keep_checkpoints)
    print(f"rredcot: comparison report {report}")
    return 0


def _run_bench(name: str, extra: list[str]) -> int:
    script = REPO_ROOT / "bench" / f"{name}.py"
    if name not in (found := benchmarks()):
        raise UserError(f"no benchmark {name!r} (found: {', '.join(found) or 'none — run from a source checkout'})")
    sys.argv = [str(script), *extra]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
