"""Credit heatmap: a weighted sample as an HTML page (tokens coloured by σ, segment boundaries with
their exit values, per-segment rewards, the line a slip checker names) and a PNG of the value curve;
``rredcot inspect``."""

from __future__ import annotations

import argparse
import html
from pathlib import Path
from typing import Any

import numpy as np
import redis

from rredcot.common.codec import decode
from rredcot.common.config import redact_url
from rredcot.common.errors import UserError
from rredcot.common.files import unreadable_file
from rredcot.common.records import RecordError, WeightedGroup, WeightedSample
from rredcot.common.streams import BATCHES, RedisUnreachable, connect, key, wait_for_redis
from rredcot.models.store import load_decoder, qwen_tokenizer_dir
from rredcot.redistributor.blame import SlipBlame
from rredcot.redistributor.segmentation import token_texts

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}
.trace{font-family:ui-monospace,monospace;font-size:13px;line-height:1.9;white-space:pre-wrap;
border:1px solid #ccc;padding:12px;border-radius:6px}
.t{border-radius:2px}.slip{outline:2px solid #e9a100}
.cut{display:inline-block;font-size:10px;color:#fff;background:#345;border-radius:3px;padding:0 4px;margin:0 2px;
line-height:1.4;vertical-align:1px}
table{border-collapse:collapse;font-size:13px;margin:12px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
.bar{display:inline-block;height:10px}.legend span{display:inline-block;width:36px;height:12px}
"""


def _colour(weight: float, positive: bool) -> str:
    """White → green (credit, A > 0) or white → red (blame, A < 0) by ``weight`` in [0, 1]."""
    w = float(np.clip(weight, 0.0, 1.0)) ** 0.5
    target = (40, 170, 80) if positive else (215, 50, 50)
    r, g, b = (round(255 + (c - 255) * w) for c in target)
    return f"rgb({r},{g},{b})"


def _fmt(v: float) -> str:
    return f"{v:.2f}" if abs(v) >= 10 else f"{v:.3g}"


def _token_html(text: str) -> str:
    return html.escape(text.replace("\n", "↵\n"))


def _segment_rows(sample: WeightedSample) -> list[str]:
    e, v, r = sample.exit_points, sample.exit_values, sample.segment_rewards
    rows = []
    for k in range(len(e) - 1):
        mass = float(sample.sigma[e[k] : e[k + 1]].sum())
        vals = f"{_fmt(v[k])} → {_fmt(v[k + 1])}" if len(v) == len(e) else "—"
        reward = float(r[k]) if k < len(r) else 0.0
        colour = "#2a5" if sample.advantage >= 0 else "#c33"
        bar = f'<span class="bar" style="width:{round(mass * 200)}px;background:{colour}"></span>'
        rows.append(
            f"<tr><td>{k}</td><td>{e[k]}–{e[k + 1]}</td><td>{e[k + 1] - e[k]}</td><td>{vals}</td>"
            f"<td>{reward:+.4g}</td><td>{mass:.3f} {bar}</td></tr>"
        )
    return rows


def slip_caption(blame: SlipBlame) -> str:
    """Which line the task's checker names first wrong, and whether σ blames it most."""
    if blame.top == 1:
        verdict = "σ blames it most"
    elif blame.top:
        verdict = "σ blames it most, tied with other lines"
    else:
        verdict = "σ blames another line more"
    where = f"line {blame.slip + 1} of {blame.lines} of working, '{blame.text}'"
    return f"the checker's first wrong line: {where}; {verdict}"


def render_html(sample: WeightedSample, texts: list[str], blame: SlipBlame | None = None) -> str:
    """The HTML page for one sample (``texts``: each completion token's text; ``blame``: the line the
    task's checker names, outlined and captioned)."""
    sigma, n = sample.sigma.astype(np.float64), len(sample.sigma)
    top = float(sigma.max()) if n else 1.0
    positive = sample.advantage >= 0
    cuts = {int(p): k for k, p in enumerate(sample.exit_points)}
    lo, hi = blame.span if blame else (0, 0)
    values = sample.exit_values
    parts = []
    for j in range(n + 1):
        if j in cuts:
            k = cuts[j]
            label = f"e{k}" + (f" v̂={_fmt(values[k])}" if len(values) == len(sample.exit_points) else "")
            parts.append(f'<span class="cut" title="exit point {k} at token {j}">{html.escape(label)}</span>')
        if j < n:
            tip = f"token {j}: σ={sigma[j]:.3g} (σ·|o|={sigma[j] * n:.2f})"
            kind = "t slip" if lo <= j < hi else "t"
            parts.append(
                f'<span class="{kind}" style="background:{_colour(sigma[j] / top, positive)}" '
                f'title="{tip}">{_token_html(texts[j])}</span>'
            )
    r = sample.rollout
    summary = (
        f"method <b>{html.escape(sample.credit_method)}</b> · reward {r.reward:g} ({html.escape(r.verdict)}) · "
        f"advantage {sample.advantage:+.3f} · {n} tokens · {len(sample.exit_points) - 1} segments · "
        f"max σ·|o| = {top * n:.2f} · finish {html.escape(r.finish_reason)}"
    )
    caption = f"<p>{html.escape(slip_caption(blame))} (outlined).</p>" if blame else ""
    legend = "".join(f'<span style="background:{_colour(w, positive)}"></span>' for w in np.linspace(0, 1, 6))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>credit heatmap {html.escape(r.id)}</title>"
        f"<style>{CSS}</style></head><body><h2>Credit heatmap</h2><p>{summary}</p>{caption}"
        f"<p class='legend'>σ: 0 {legend} max ({'credit' if positive else 'blame'}); "
        f"dark tags mark exit points with their value v̂.</p>"
        "<table><tr><th>segment</th><th>tokens</th><th>length</th><th>v̂ start → end</th>"
        f"<th>reward r_k{' (less the group baseline)' if baselined(sample) else ''}</th>"
        f"<th>σ mass</th></tr>{''.join(_segment_rows(sample))}</table>"
        f"<div class='trace'>{''.join(parts)}</div></body></html>"
    )


def baselined(sample: WeightedSample) -> bool:
    """Whether the sample's segment rewards are not its exit values' changes (a baseline took part)."""
    v, r = sample.exit_values, sample.segment_rewards
    return len(v) == len(r) + 1 and len(r) > 0 and not np.allclose(np.diff(v.astype(np.float64)), r, atol=1e-4)


def render_png(sample: WeightedSample, out_png: str | Path, blame: SlipBlame | None = None) -> None:
    """Value curve over exit points (top) and σ·|o| per token with segment boundaries (bottom), the
    line ``blame`` names shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_v, ax_s) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, height_ratios=[3, 2])
    e, v = sample.exit_points, sample.exit_values
    if len(v) == len(e) and len(v):
        ax_v.plot(e, v, marker="o", color="#245")
        for k, r in enumerate(sample.segment_rewards):
            ax_v.annotate(
                f"{r:+.2g}",
                ((e[k] + e[k + 1]) / 2, (v[k] + v[k + 1]) / 2),
                fontsize=7,
                ha="center",
                color="#2a5" if r > 0 else "#c33",
            )
    else:
        ax_v.text(
            0.5,
            0.5,
            "no exit values (method without values, or no reference pair)",
            transform=ax_v.transAxes,
            ha="center",
        )
    ax_v.set_ylabel("exit value v̂")
    title = f"{sample.credit_method}: reward {sample.rollout.reward:g}, advantage {sample.advantage:+.3f}"
    if baselined(sample):
        title += "\nlabels: segment rewards less the group's (baseline=group), not v̂'s own changes"
    if blame:
        title += f"\n{slip_caption(blame)} (shaded)"
    ax_v.set_title(title, fontsize=10)
    n = len(sample.sigma)
    ax_s.bar(np.arange(n), sample.sigma * n, width=1.0, color="#2a5" if sample.advantage >= 0 else "#c33")
    ax_s.axhline(1.0, color="#888", lw=0.8, ls="--")
    if blame:
        ax_s.axvspan(blame.span[0] - 0.5, blame.span[1] - 0.5, color="#e9a100", alpha=0.25, lw=0)
    for p in e:
        for ax in (ax_v, ax_s):
            ax.axvline(p, color="#ccc", lw=0.6, zorder=0)
    ax_s.set_ylabel("σ·|o|")
    ax_s.set_xlabel("completion token")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def render_heatmap(
    sample: WeightedSample, tokenizer: Any, out_html: str | Path, out_png: str | Path, blame: SlipBlame | None = None
) -> None:
    """Write the HTML page and the PNG for one weighted sample (``blame``: the line a checker names)."""
    texts = token_texts(tokenizer, sample.rollout.completion_ids.tolist())
    Path(out_html).write_text(render_html(sample, texts, blame), encoding="utf-8")
    render_png(sample, out_png, blame)


RECORD_MAX_BYTES = 2**30  # a saved group of 16 samples × 25k tokens is about 10 MB


def load_group(source: str, run: str | None) -> WeightedGroup:
    """A saved msgpack ``WeightedGroup``/``WeightedSample`` file, or the newest entry of a run's batches
    stream; ``UserError`` for a source that is none of these."""
    if source.startswith(("redis://", "rediss://", "unix://")):
        if not run:
            raise UserError("reading from Redis needs --run (the run id, run.name)")
        try:  # one probe, not connect's half a minute of silent retries
            wait_for_redis(source, 0, print, what="the source")
            entries = connect(source).xrevrange(key(run, BATCHES), count=1)
        except RedisUnreachable as e:
            raise UserError(str(e)) from None
        except (redis.RedisError, ValueError) as e:
            raise UserError(f"{redact_url(source)} does not answer ({type(e).__name__}): check the URL") from None
        if not entries:
            raise UserError(f"stream {key(run, BATCHES)} at {redact_url(source)} is empty: is --run {run!r} right?")
        return _decoded(entries[0][1].get(b"d", b""), f"the newest entry of {key(run, BATCHES)}", WeightedGroup)
    problem = unreadable_file(source, RECORD_MAX_BYTES)
    if problem is not None:
        raise UserError(f"{source}: {problem}")
    try:
        data = Path(source).read_bytes()
    except OSError as e:
        raise UserError(f"{source}: {e.strerror or e}") from None
    record = _decoded(data, source)
    if isinstance(record, WeightedSample):
        r = record.rollout
        return WeightedGroup(r.group_id, r.prompt_id, np.zeros(0, np.int32), [record])
    if not isinstance(record, WeightedGroup):
        raise UserError(f"{source} holds a {type(record).__name__}, not a weighted group or sample")
    return record


def _decoded(data: bytes, what: str, expect: type | None = None) -> Any:
    """The record in ``data``; a ``UserError`` naming ``what`` when it is none."""
    try:
        return decode(data, expect)
    except RecordError as e:
        raise UserError(f"{what} is not a saved record ({e})") from None


def inspect_command(args: argparse.Namespace) -> int:
    """``rredcot inspect SOURCE [--run R] [--tokenizer DIR] [--out PREFIX] [--index I]``."""
    if not (folder := Path(args.out).parent).is_dir():
        raise UserError(f"--out {args.out}: no folder {folder}")
    group = load_group(args.source, args.run)
    n = len(group.samples)
    if not 0 <= args.index < n:
        raise UserError(f"--index {args.index} is out of range: the group holds {n} sample(s), --index 0..{n - 1}")
    sample = group.samples[args.index]
    tokenizer = load_decoder(args.tokenizer or qwen_tokenizer_dir())
    out_html, out_png = f"{args.out}.html", f"{args.out}.png"
    render_heatmap(sample, tokenizer, out_html, out_png)
    print(f"wrote {out_html} and {out_png}")
    return 0
