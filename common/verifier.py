"""Answer verification with math-verify, isolated in a worker process with a hard timeout.

math-verify uses signal-based timeouts, which only work in a process's main thread, and sympy can
hang on pathological input; so each check runs in the main thread of a dedicated child process.
If the child does not answer within ``timeout_s`` it is killed and replaced, the sample gets
reward 0 with verdict ``timeout``, and ``Verifier.timeouts`` counts it. Requests and replies cross
the pipe as msgpack bytes (no pickle).
"""

from __future__ import annotations

import multiprocessing as mp
import re
from dataclasses import dataclass
from multiprocessing.connection import Connection

import msgpack

from rredcot.common.data import last_boxed

_ANSWER_LINE = re.compile(r"answer\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)


def extract_answer(completion: str) -> str | None:
    """The model's final answer: the last ``Answer: ...`` line, else the last ``\\boxed{}``."""
    for line in reversed(completion.strip().splitlines()):
        m = _ANSWER_LINE.search(line)
        if m:
            return m.group(1).strip().rstrip(".").strip()
    return last_boxed(completion)


def answers_match(predicted: str, gold: str) -> bool:
    """math-verify equivalence (call only in a process's main thread)."""
    from math_verify import parse, verify

    return bool(verify(parse(_as_math(gold)), parse(_as_math(predicted))))


def _as_math(answer: str) -> str:
    return answer if "\\boxed" in answer or answer.startswith("$") else f"${answer}$"


@dataclass(frozen=True)
class Verdict:
    reward: float
    verdict: str  # correct | wrong | no_answer | timeout | error


def _serve(conn: Connection) -> None:
    """Child process loop: msgpack [pred, gold] in, msgpack [ok, error] out."""
    while True:
        try:
            pred, gold = msgpack.unpackb(conn.recv_bytes())
        except EOFError:
            return
        try:
            conn.send_bytes(msgpack.packb([answers_match(pred, gold), None]))
        except Exception as e:  # a parse failure is a wrong answer, reported as such
            conn.send_bytes(msgpack.packb([False, f"{type(e).__name__}: {e}"]))


class Verifier:
    """Scores completions against gold answers; one child process, restarted after a hang."""

    def __init__(self, timeout_s: float = 5.0, start_timeout_s: float = 120.0) -> None:
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.timeouts = 0
        self.errors = 0
        self._ctx = mp.get_context("spawn")
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def _ensure_started(self) -> Connection:
        if self._proc is None or not self._proc.is_alive():
            parent, child = self._ctx.Pipe()
            self._proc = self._ctx.Process(target=_serve, args=(child,), daemon=True, name="rredcot-verifier")
            self._proc.start()
            self._conn = parent
            parent.send_bytes(msgpack.packb(["1", "1"]))  # prime: import math-verify outside any timeout
            if not parent.poll(self.start_timeout_s):
                self._kill()
                raise RuntimeError(f"verifier process did not start within {self.start_timeout_s}s")
            parent.recv_bytes()
        assert self._conn is not None
        return self._conn

    def score(self, completion: str, gold: str) -> Verdict:
        predicted = extract_answer(completion)
        if predicted is None:
            return Verdict(0.0, "no_answer")
        conn = self._ensure_started()
        conn.send_bytes(msgpack.packb([predicted, gold]))
        if not conn.poll(self.timeout_s):
            self.timeouts += 1
            self._kill()
            return Verdict(0.0, "timeout")
        ok, error = msgpack.unpackb(conn.recv_bytes())
        if error is not None:
            self.errors += 1
            return Verdict(0.0, "error")
        return Verdict(1.0 if ok else 0.0, "correct" if ok else "wrong")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
        self._proc, self._conn = None, None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._kill()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
