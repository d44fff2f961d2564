"""The frozen scorer π_rf (reference model or a lagged policy copy) with its tokenizer settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rredcot.common.prompts import opens_thought
from rredcot.common.records import RolloutGroup, check_vocabulary
from rredcot.redistributor.entropy import TokenCounter


@dataclass
class Scorer:
    """Model + tokenizer + what depends on the tokenizer (the exit string's ids, the thinking tags)."""

    model: Any
    tokenizer: Any
    exit_string: str
    think_start: str = "<think>"
    think_end: str = "</think>"
    version: int = 0
    tokens: TokenCounter = field(default_factory=TokenCounter)  # running total, for metrics
    exit_ids: list[int] = field(init=False)
    end_ids: frozenset[int] = field(init=False)  # special tokens (EOS, end of turn): a completion ends there

    def __post_init__(self) -> None:
        self.exit_ids = list(self.tokenizer(self.exit_string, add_special_tokens=False)["input_ids"])
        self.end_ids = frozenset(self.tokenizer.all_special_ids)

    def check_ids(self, group: RolloutGroup) -> None:
        """``RecordError`` when a token id of ``group`` lies outside the scorer's vocabulary."""
        check_vocabulary(group.token_arrays(), self.model.get_input_embeddings().weight.shape[0], "the scorer's")

    def opens_thought(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt opens the thought (its chat template ends it with ``think_start``,
        DeepSeek-R1-Distill style): its completions then hold only the closing tag."""
        return opens_thought(prompt_ids, self.tokenizer, self.think_start)

    def content_end(self, ids: Sequence[int]) -> int:
        """The length of ``ids`` without its trailing end tokens (EOS, end of turn)."""
        n = len(ids)
        while n and ids[n - 1] in self.end_ids:
            n -= 1
        return n

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Accept a weight update (e.g. the policy at ``version`` when ``credit.scorer=policy``).

        Every parameter must be present except tied ones (a tied LM head may be left out).
        """
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        params = dict(self.model.named_parameters())  # tied weights appear once
        untied_missing = [k for k in missing if k in params]
        if unexpected or untied_missing:
            raise ValueError(
                f"weights v{version} do not fit the scorer: missing {untied_missing[:5]}, unexpected {unexpected[:5]}"
            )
        self.version = version
