"""``oracle``: σ's mass above the floor on the line the task's slip checker names, on hand-built chain
traces with the real Qwen3 tokenizer (the line located from the tokenizer's character offsets, not
from the method's own line reader); its config check; Σσ = 1 as a property."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.common.config import Config, ConfigError, load_config
from rredcot.common.records import RolloutGroup, RolloutRecord, new_id
from rredcot.redistributor.credit import redistribute_group
from rredcot.redistributor.methods import OracleSettings
from rredcot.tasks.task import build_task

CHAIN = ["credit.method=oracle", "task.settings.op=chain", "task.settings.chain_steps=3"]
EOS = "<|im_end|>"


def chain(think: bool = False, *overrides: str) -> tuple[Config, list[str], str]:
    """A chain config, its first problem's working lines and its id."""
    cfg = load_config("tests", [*CHAIN, f"task.settings.think={str(think).lower()}", *overrides])
    problem = build_task(cfg.task).problems(cfg.data, cfg.run.seed)[0]
    lines = [x for x in problem.solution.splitlines() if x.strip() and not x.startswith(("<think>", "</think>"))]
    return cfg, lines[:-1], problem.id


def slipped(line: str) -> str:
    """The line with its last number one more: a wrong result."""
    return re.sub(r"(\d+)(\D*)$", lambda m: f"{int(m[1]) + 1}{m[2]}", line)


def text(lines: list[str], answer: str | None, think: bool) -> str:
    body = "\n".join(lines) + "\n"
    if think:
        body = f"<think>\n{body}</think>\n\n"
    return body + (f"Answer: {answer}" if answer is not None else "") + EOS


def group_of(tok, prompt_id: str, texts: list[str], rewards: list[float]) -> RolloutGroup:
    gid = new_id()
    samples = []
    for i, (t, r) in enumerate(zip(texts, rewards, strict=True)):
        ids = np.array(tok(t, add_special_tokens=False)["input_ids"], np.int32)
        verdict = "correct" if r > 0 else "wrong"
        samples.append(
            RolloutRecord(
                new_id(),
                gid,
                prompt_id,
                i,
                ids,
                np.zeros(len(ids), np.float32),
                np.zeros((1, 2), np.int32),
                "stop",
                r,
                verdict,
            )
        )
    prompt = np.array(tok("What is it?", add_special_tokens=False)["input_ids"], np.int32)
    return RolloutGroup(gid, prompt_id, prompt, [], [], samples)


def tokens_in(tok, full: str, lo: int, hi: int) -> np.ndarray:
    """The tokens of ``full`` whose first character lies in [lo, hi) (the tokenizer's own offsets)."""
    offsets = tok(full, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return np.array([lo <= a < hi for a, _ in offsets])


def assert_blamed(sigma: np.ndarray, on: np.ndarray, lam: float) -> None:
    """λ/|o| off the line, λ/|o| + (1 − λ)/|line| on it."""
    n, size = len(sigma), int(on.sum())
    assert size > 0
    np.testing.assert_allclose(sigma[~on], lam / n, rtol=1e-5)
    np.testing.assert_allclose(sigma[on], lam / n + (1 - lam) / size, rtol=1e-5)
    assert abs(float(sigma.sum(dtype=np.float64)) - 1) < 1e-6


@pytest.mark.parametrize("think", [False, True])
def test_a_wrong_trace_is_blamed_on_the_line_the_checker_names(qwen_tok, think) -> None:
    cfg, lines, pid = chain(think)
    task = build_task(cfg.task)
    problem = task.problems(cfg.data, cfg.run.seed)[0]
    wrong = [lines[0], slipped(lines[1]), *lines[2:]]
    assert task.first_slip(problem, wrong) == 1  # the label the oracle takes
    texts = [text(lines, problem.answer, think), text(wrong, "0", think)]
    out = redistribute_group(group_of(qwen_tok, pid, texts, [1.0, 0.0]), cfg, tokenizer=qwen_tok)
    right, blamed = out.samples
    assert right.advantage > 0 and blamed.advantage < 0 and blamed.credit_method == "oracle"
    np.testing.assert_allclose(right.sigma, 1 / len(right.sigma), rtol=1e-6)  # a correct trace: uniform
    start = texts[1].index(wrong[1])
    on = tokens_in(qwen_tok, texts[1], start, start + len(wrong[1]) + 1)  # its newline too
    assert_blamed(blamed.sigma, on, OracleSettings().uniform_mix)
    assert blamed.sigma_fallback == ""


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_right_working_or_missing_steps_put_the_blame_on_the_answer_line(qwen_tok, lam) -> None:
    """The checker passes the working (None) or finds steps missing (len(lines)): the answer line,
    up to the end of the content (not the end token), takes the blame."""
    cfg, lines, pid = chain(False, f"credit.settings.oracle.uniform_mix={lam}")
    texts = [text(lines, "1", False), text(lines[:1], "1", False), text(lines, None, True)]
    out = redistribute_group(group_of(qwen_tok, pid, texts, [0.0, 0.0, 1.0]), cfg, tokenizer=qwen_tok)
    for t, w in zip(texts[:2], out.samples[:2]):
        start = t.index("Answer:")
        assert_blamed(w.sigma, tokens_in(qwen_tok, t, start, len(t) - len(EOS)), lam)


def test_a_wrong_trace_with_no_line_to_blame_is_uniform_with_its_reason(qwen_tok) -> None:
    cfg, lines, pid = chain()
    texts = [text(lines, None, False), text(lines, "1", False)]  # right working, no answer line
    no_line, fine = redistribute_group(group_of(qwen_tok, pid, texts, [0.0, 1.0]), cfg, tokenizer=qwen_tok).samples
    assert no_line.sigma_fallback == "no_line" and fine.sigma_fallback == ""
    np.testing.assert_allclose(no_line.sigma, 1 / len(no_line.sigma), rtol=1e-6)


def test_only_blamed_traces_need_their_problem(qwen_tok) -> None:
    """A group without blame (every advantage 0) is uniform; a wrong trace of an unknown problem is
    the entry's error, naming the id."""
    cfg, lines, _ = chain()
    texts = [text(lines, "1", False)] * 2
    out = redistribute_group(group_of(qwen_tok, "nowhere-7", texts, [0.0, 0.0]), cfg, tokenizer=qwen_tok)
    assert all(np.allclose(w.sigma, 1 / len(w.sigma)) for w in out.samples)
    with pytest.raises(ValueError, match="prompt 'nowhere-7' is no problem of task 'arith'"):
        redistribute_group(group_of(qwen_tok, "nowhere-7", texts, [0.0, 1.0]), cfg, tokenizer=qwen_tok)
    with pytest.raises(ValueError, match="needs the run's tokenizer"):
        redistribute_group(group_of(qwen_tok, "nowhere-7", texts, [0.0, 1.0]), cfg)


@pytest.mark.parametrize(
    ("overrides", "which"),
    [(["task.settings.op=mul"], "task 'arith' with task.settings.op='mul'"), (["task.name=choice"], "task 'choice'")],
)
def test_a_task_without_a_slip_checker_is_refused_when_the_config_loads(overrides, which) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("tests", ["credit.method=oracle", *overrides])
    msg = str(e.value)
    assert msg.startswith("credit.method = 'oracle' is not allowed; expected a task with a slip checker"), msg
    assert f"{which} has none" in msg and "task.settings.op=chain" in msg, msg
    assert load_config("tests", CHAIN).credit.method == "oracle"


def test_the_oracle_costs_no_scorer_and_its_config_no_torch() -> None:
    code = (
        "import sys\n"
        "from rredcot.common.config import load_config, resolve_credit\n"
        f"spec = resolve_credit(load_config('tests', {CHAIN!r}))\n"
        "assert not spec.method.needs_scorer and spec.method.needs_tokenizer and spec.settings.uniform_mix == 0.3\n"
        "assert 'torch' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


@settings(max_examples=40, deadline=None)
@given(
    think=st.booleans(),
    deltas=st.lists(st.sampled_from([0, 0, 1, -2]), min_size=3, max_size=3),
    keep=st.integers(0, 3),
    blank=st.booleans(),
    answer=st.sampled_from([None, "right", "wrong"]),
    eos=st.booleans(),
    reward=st.sampled_from([0.0, 1.0]),
    lam=st.floats(0, 1),
)
def test_sigma_sums_to_one(qwen_tok, think, deltas, keep, blank, answer, eos, reward, lam) -> None:
    """Σσ = 1 and σ ≥ 0 on every trace: slips anywhere, missing steps, blank lines, no answer line, no
    end token, correct or wrong; a blamed trace's σ never falls below the floor λ/|o|."""
    cfg, lines, pid = chain(think, f"credit.settings.oracle.uniform_mix={lam}")
    problem = build_task(cfg.task).problems(cfg.data, cfg.run.seed)[0]
    work = [slipped(x) if d else x for x, d in zip(lines, deltas)][:keep]
    work = [x for line in work for x in ((line, "") if blank else (line,))]
    full = text(work, {None: None, "right": problem.answer, "wrong": "-1"}[answer], think)
    full = full if eos else full.removesuffix(EOS)
    out = redistribute_group(
        group_of(qwen_tok, pid, [full, text(lines, "1", False)], [reward, 1 - reward]), cfg, tokenizer=qwen_tok
    )
    for w in out.samples:
        n = len(w.sigma)
        assert w.sigma.shape == (n,) and np.all(w.sigma >= 0)
        assert abs(float(w.sigma.sum(dtype=np.float64)) - 1) < 1e-5
        assert np.all(w.sigma >= lam / n * (1 - 1e-5))
