"""Answer verification for every task, isolated in a worker process with a hard timeout.

The task (``tasks.task``) says how an answer is read (``extract_answer``, in the caller, from the
text after the thinking: ``answer_text``) and whether it is right (``answers_match``, in the child).
Checkers can hang: math-verify's own timeouts are signal-based and work only in a process's main
thread, and sympy can hang on pathological input. So each check runs in the main thread of a
dedicated child process; if the child does not answer within ``timeout_s`` it is killed and
replaced, the sample gets reward 0 with verdict ``timeout``, and ``Verifier.timeouts`` counts it; a
checker that raises, kills its process, or answers with anything but a bool (NaN, 0.3, ``"no"``:
truthy values that once scored 1) gives reward 0 with verdict ``error`` (``Verifier.errors``),
and the worker's log names the task and what it returned. The generator, the evaluator and
Monte-Carlo credit all use this one class. Everything crossing the pipe is msgpack (no pickle):
first the task (name and settings), then [pred, gold] pairs.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection

import msgpack
import numpy as np

from rredcot.common.config import Config, ModelConfig, TaskConfig
from rredcot.tasks.task import answer_text, build_task

log = logging.getLogger(__name__)
LOGGED_ERRORS = 5  # a broken checker fails every sample: its first errors are logged, then every 1000th


@dataclass(frozen=True)
class Verdict:
    reward: float
    verdict: str  # correct | wrong | no_answer | timeout | error


def checked(task: str, value: object) -> tuple[bool, str | None]:
    """(ok, error) from what a task's ``answers_match`` returned: a bool is the verdict; anything
    else is the task's error, never a truthy "correct"."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value), None
    return False, f"task {task!r}: answers_match returned {value!r} ({type(value).__name__}), not a bool"


def _serve(conn: Connection) -> None:
    """Child process loop: the task spec, then msgpack [pred, gold] in, msgpack [ok, error] out."""
    spec = TaskConfig(**msgpack.unpackb(conn.recv_bytes()))
    task = build_task(spec)
    while True:
        try:
            pred, gold = msgpack.unpackb(conn.recv_bytes())
        except EOFError:
            return
        try:
            conn.send_bytes(msgpack.packb(checked(spec.name, task.answers_match(pred, gold))))
        except Exception as e:  # a parse failure is a wrong answer, reported as such
            conn.send_bytes(msgpack.packb([False, f"task {spec.name!r}: {type(e).__name__}: {e}"]))


class Verifier:
    """Scores completions of one task against gold answers; one child process, restarted after a hang.

    ``think``: the model's thinking tags (``model.think_start``, ``model.think_end``); the answer is
    read only after the thinking, and a completion whose thought never closed has none."""

    def __init__(
        self,
        task: TaskConfig,
        timeout_s: float = 5.0,
        start_timeout_s: float = 120.0,
        think: tuple[str, str] = (ModelConfig.think_start, ModelConfig.think_end),
    ) -> None:
        self.spec, self.task, self.think = task, build_task(task), think
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.timeouts = 0
        self.errors = 0
        self._ctx = mp.get_context("spawn")
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None

    @classmethod
    def from_config(cls, cfg: Config) -> Verifier:
        """The run's verifier: its task, ``generation.verifier_timeout_s`` and the model's thinking tags."""
        return cls(cfg.task, cfg.generation.verifier_timeout_s, think=(cfg.model.think_start, cfg.model.think_end))

    def _ensure_started(self) -> Connection:
        if self._proc is None or not self._proc.is_alive():
            parent, child = self._ctx.Pipe()
            self._proc = self._ctx.Process(target=_serve, args=(child,), daemon=True, name="rredcot-verifier")
            self._proc.start()
            self._conn = parent
            parent.send_bytes(msgpack.packb(asdict(self.spec)))
            parent.send_bytes(msgpack.packb(["1", "1"]))  # prime: import the checker outside any timeout
            if not parent.poll(self.start_timeout_s):
                self._kill()
                raise RuntimeError(f"verifier process did not start within {self.start_timeout_s}s")
            parent.recv_bytes()
        assert self._conn is not None
        return self._conn

    def score(self, completion: str, gold: str, opened: bool = False) -> Verdict:
        """The verdict on ``completion``'s answer (``opened``: its prompt opened the thought)."""
        text = answer_text(completion, *self.think, opened=opened)
        predicted = None if text is None else self.task.extract_answer(text)
        if predicted is None:
            return Verdict(0.0, "no_answer")
        conn = self._ensure_started()
        conn.send_bytes(msgpack.packb([predicted, gold]))
        if not conn.poll(self.timeout_s):
            self.timeouts += 1
            self._kill()
            return Verdict(0.0, "timeout")
        try:
            ok, error = msgpack.unpackb(conn.recv_bytes())
        except (EOFError, OSError):  # the child died while checking (a crash inside the task's checker)
            self._kill()
            error = "the verifier process died"
        if error is not None:
            self.errors += 1
            if self.errors <= LOGGED_ERRORS or self.errors % 1000 == 0:
                log.warning("verifier error %d (reward 0): %s", self.errors, error)
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
