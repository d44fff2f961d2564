"""A generator's watch on prompts too long for the context: when every training prompt is, it stops.

A prompt the engine cannot generate for is rejected and the admission slot reopened, so the run
still gets full steps from the prompts that fit. When none fits, that loop would cycle through the
pool for ever with the console at ``training step 0``; this stops it with one line instead.
"""

from __future__ import annotations

from rredcot.common.errors import UserError


class NoPromptFits(UserError):
    """Every training prompt fills the model's context: nothing can be generated, so nothing trained."""


class PromptFit:
    """Counts the distinct training prompts rejected as too long until one fits; raises
    ``NoPromptFits`` when they are the whole pool of ``pool`` prompts."""

    def __init__(self, pool: int, max_model_len: int) -> None:
        self.pool, self.max_model_len = pool, max_model_len
        self.any_fit = False
        self._rejected: dict[str, int] = {}  # problem id -> its prompt's tokens

    def fits(self) -> None:
        """A prompt was accepted: the run can train, whatever else is rejected."""
        self.any_fit = True

    def too_long(self, problem_id: str, tokens: int) -> None:
        """The prompt of ``problem_id`` (``tokens`` long, template included) left no room to generate."""
        if self.any_fit:
            return
        self._rejected[problem_id] = tokens
        if len(self._rejected) >= self.pool:
            shortest = min(self._rejected.values())
            raise NoPromptFits(
                f"no training prompt fits the context: all {self.pool} were rejected as too long (the shortest "
                f"has {shortest} tokens with the chat template; a prompt must be shorter than model.max_model_len "
                f"= {self.max_model_len}) -> raise model.max_model_len (up to the model's context) or use "
                "shorter prompts"
            )
