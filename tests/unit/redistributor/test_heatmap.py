"""Heatmap rendering of a real redistributed trace, and ``rredcot inspect`` on a file and on Redis."""

from __future__ import annotations

import argparse
import html
import os

import numpy as np
import pytest

from rredcot.common.codec import encode
from rredcot.common.config import Config
from rredcot.common.errors import UserError
from rredcot.common.streams import BATCHES, Producer, key
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.blame import SlipBlame
from rredcot.redistributor.credit import redistribute_group
from rredcot.redistributor.heatmap import baselined, inspect_command, load_group, render_heatmap
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.segmentation import token_texts
from tests.unit.redistributor.cases import credit_config, make_group


def _weighted(qwen_tok):
    cfg = Config()
    cfg.credit = credit_config(segmentation={"segments": 4, "min_segment_tokens": 2}, uniform_mix=0.1)
    group = make_group(qwen_tok)
    return redistribute_group(
        group, cfg, Scorer(build_tiny_model("qwen3", seed=3), qwen_tok, cfg.credit.scorer.exit_string)
    )


def test_render_heatmap(qwen_tok, tmp_path) -> None:
    sample = _weighted(qwen_tok).samples[0]
    render_heatmap(sample, qwen_tok, tmp_path / "h.html", tmp_path / "h.png")
    page = (tmp_path / "h.html").read_text()
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    n = len(sample.sigma)
    assert page.count('class="t"') == n and page.count('class="cut"') == len(sample.exit_points)
    for text in token_texts(qwen_tok, sample.rollout.completion_ids.tolist()):
        assert html.escape(text.replace("\n", "↵\n")) in page
    assert page.count("<tr><td>") == len(sample.exit_points) - 1  # one row per segment
    top = int(np.argmax(sample.sigma))
    assert f"token {top}: σ={sample.sigma[top]:.3g}" in page
    assert "(less the group baseline)" in page  # the default baseline: rewards are not v̂'s changes


def test_the_line_a_checker_names_is_outlined_and_captioned(qwen_tok, tmp_path) -> None:
    sample = _weighted(qwen_tok).samples[2]
    blame = SlipBlame(0, "I think 12*7 = 74.", (3, 11), 2, 0.5)
    render_heatmap(sample, qwen_tok, tmp_path / "h.html", tmp_path / "h.png", blame)
    page = (tmp_path / "h.html").read_text()
    assert page.count('class="t slip"') == 8 and page.count('class="t"') == len(sample.sigma) - 8
    caption = "the checker's first wrong line: line 1 of 2 of working, 'I think 12*7 = 74.'; σ blames it most, tied"
    assert html.escape(caption) in page
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_baseline_is_named_only_where_rewards_differ_from_the_value_changes(qwen_tok) -> None:
    sample = _weighted(qwen_tok).samples[0]
    assert baselined(sample)
    sample.segment_rewards = np.diff(sample.exit_values).astype(np.float32)
    assert not baselined(sample)
    sample.exit_values = np.zeros(0, np.float32)  # a method without values
    assert not baselined(sample)


def test_inspect_from_file_and_from_redis(qwen_tok, tmp_path, redis_client, redis_server, run_id) -> None:
    group = _weighted(qwen_tok)
    saved = tmp_path / "g.msgpack"
    saved.write_bytes(encode(group))
    args = argparse.Namespace(source=str(saved), run=None, tokenizer=None, out=str(tmp_path / "f"), index=1)
    assert inspect_command(args) == 0 and (tmp_path / "f.html").exists() and (tmp_path / "f.png").exists()
    n = len(group.samples)
    for index in (n, -1):
        with pytest.raises(
            UserError, match=rf"--index {index} is out of range: the group holds {n} sample\(s\), --index 0..{n - 1}"
        ):
            inspect_command(argparse.Namespace(**{**vars(args), "index": index}))
    with pytest.raises(UserError, match="is empty: is --run 'nope' right"):
        load_group(redis_server.url, "nope")
    Producer(redis_client, key(run_id, BATCHES), maxlen=8).put(encode(group))
    args = argparse.Namespace(source=redis_server.url, run=run_id, tokenizer=None, out=str(tmp_path / "r"), index=2)
    assert inspect_command(args) == 0
    assert group.samples[2].rollout.id in (tmp_path / "r.html").read_text()
    Producer(redis_client, key(run_id, BATCHES), maxlen=8).put(b"\xc1junk")  # the newest entry: no record
    with pytest.raises(UserError, match=rf"the newest entry of rredcot:{run_id}:batches is not a saved record"):
        load_group(redis_server.url, run_id)


@pytest.mark.timeout(30)  # reading a FIFO without a writer blocks: this would hang, not fail
def test_inspect_refuses_a_fifo_a_device_and_a_file_over_the_bound(tmp_path, monkeypatch) -> None:
    """``rredcot inspect`` on a FIFO blocked, and on /dev/zero read until memory ran out."""
    from rredcot.redistributor import heatmap

    os.mkfifo(fifo := tmp_path / "r.fifo")
    with pytest.raises(UserError, match=r"r.fifo: is a FIFO \(named pipe\), not a regular file"):
        load_group(str(fifo), None)
    with pytest.raises(UserError, match="/dev/zero: is a character device, not a regular file"):
        load_group("/dev/zero", None)
    (big := tmp_path / "big.msgpack").write_bytes(b"\x00" * 2048)
    monkeypatch.setattr(heatmap, "RECORD_MAX_BYTES", 1024)
    with pytest.raises(UserError, match="big.msgpack: is 2,048 bytes, over the bound of 1,024"):
        load_group(str(big), None)
