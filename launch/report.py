"""The end-of-run report: markdown summary, PNG learning curves, credit heatmaps, final model link."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (panel title, tier, metric key) — what the curves show when the run reported it
CURVES = [
    ("reward (sampled, training)", "learner", "reward_mean"),
    ("policy loss", "learner", "loss"),
    ("clip fraction", "learner", "clip_frac"),
    ("generator tokens/s", "generator", "tokens_per_s"),
    ("redistributor samples/s", "redistributor", "rollouts_per_s"),
    ("learner idle fraction", "learner", "idle_frac"),
]


def plot_curves(history: list[dict[str, Any]], evals: list[dict[str, Any]], out: Path) -> Path:
    """``history``: points {t, tier, worker, step, values}; ``evals``: EvalResult dicts with ``step``."""
    panels = [(title, tier, k) for title, tier, k in CURVES
              if any(p["tier"] == tier and k in p["values"] for p in history)]
    n = len(panels) + 1
    cols = 2
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    ax = axes[0][0]
    if evals:
        steps = [e["step"] for e in evals]
        for name, color in (("sampled", "tab:blue"), ("greedy", "tab:orange")):
            ys = [e[name] for e in evals]
            lo = [e[f"{name}_low"] for e in evals]
            hi = [e[f"{name}_high"] for e in evals]
            ax.plot(steps, ys, "o-", color=color, label=f"{name} accuracy")
            ax.fill_between(steps, lo, hi, color=color, alpha=0.2)
        ax.legend(loc="best")
    ax.set_title("held-out accuracy (95% CI)")
    ax.set_xlabel("learner step")
    ax.set_ylim(0, 1)
    for i, (title, tier, k) in enumerate(panels, start=1):
        ax = axes[i // cols][i % cols]
        for worker in sorted({p["worker"] for p in history if p["tier"] == tier}):
            pts = [(p["step"], p["values"][k]) for p in history if p["worker"] == worker and k in p["values"]]
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], label=worker)
        ax.set_title(title)
        ax.set_xlabel("learner step")
        if len({p["worker"] for p in history if p["tier"] == tier}) > 1:
            ax.legend(loc="best", fontsize=8)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _fmt(e: dict[str, Any], name: str) -> str:
    return f"{e[name]:.3f} [{e[f'{name}_low']:.3f}, {e[f'{name}_high']:.3f}]"


def write_summary(out: Path, cfg_yaml: str, evals: list[dict[str, Any]], final: dict[str, dict[str, Any]],
                  wall_s: float, artefacts: dict[str, str]) -> Path:
    lines = ["# rredcot run report", "", f"Wall time: {wall_s / 60:.1f} min", ""]
    if evals:
        first, last = evals[0], evals[-1]
        lines += [
            f"## Held-out accuracy ({first['problems']} problems, {first['samples_per_problem']} samples each at "
            "the sampling temperature; 95% intervals over problems)", "",
            "| learner step | policy version | sampled | greedy |", "|---:|---:|---|---|",
        ]
        lines += [f"| {e['step']} | {e['version']} | {_fmt(e, 'sampled')} | {_fmt(e, 'greedy')} |" for e in evals]
        if len(evals) > 1:
            from rredcot.launch.evaluate import paired_change

            d, lo, hi = paired_change(first["sampled_per_problem"], last["sampled_per_problem"])
            verdict = "improved" if lo > 0 else ("got worse" if hi < 0 else "did not change measurably")
            lines += ["", f"Sampled accuracy {verdict}: {first['sampled']:.3f} → {last['sampled']:.3f}, a change of "
                      f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}] (95% interval of the mean per-problem change, paired "
                      "over the same held-out problems)."]
    lines += ["", "## Final counters per worker", "", "| worker | tier | metrics |", "|---|---|---|"]
    for worker, values in sorted(final.items()):
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(values.items()) if k != "tier" and isinstance(v, float))
        lines.append(f"| {worker} | {values.get('tier', '')} | {shown} |")
    lines += ["", "## Files", ""] + [f"- {k}: `{v}`" for k, v in artefacts.items()]
    lines += ["", "## Config", "", "```yaml", cfg_yaml.rstrip(), "```", ""]
    out.write_text("\n".join(lines))
    return out
