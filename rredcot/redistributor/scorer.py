"""The frozen scorer π_rf (reference model or a lagged policy copy) with its tokenizer settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rredcot.common.records import RolloutGroup, check_vocabulary
from rredcot.redistributor.entropy import TokenCounter
from rredcot.redistributor.lines import content_end
from rredcot.redistributor.references import Construct, Pair, TailText, split_pair
from rredcot.redistributor.segmentation import keyword_boundaries, token_texts
from rredcot.tasks.prompts import opens_thought


@dataclass
class Scorer:
    """Model + tokenizer + what depends on the tokenizer (the exit string's ids, the thinking tags)."""

    model: Any
    tokenizer: Any
    exit_string: str
    think_start: str = "<think>"
    think_end: str = "</think>"
    version: int = 0
    answer_template: str = "Answer: "  # the task's (``Task.answer_template``)
    tokens: TokenCounter = field(default_factory=TokenCounter)  # running total, for metrics
    exit_ids: list[int] = field(init=False)
    end_ids: frozenset[int] = field(init=False)  # special tokens (EOS, end of turn): a completion ends there
    tail_text: TailText = field(init=False)

    def __post_init__(self) -> None:
        encode = lambda text: list(self.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        self.exit_ids = encode(self.exit_string)
        self.end_ids = frozenset(self.tokenizer.all_special_ids)
        self.tail_text = TailText(tuple(self.exit_ids), tuple(encode(self.exit_string.lstrip("\n"))), self.ends_line)

    def ends_line(self, token_id: int) -> bool:
        """Whether the token's text ends with a newline."""
        return token_texts(self.tokenizer, [token_id])[0].endswith("\n")

    def constructs(self, pairs: Sequence[Pair], keywords: Sequence[str], max_suffixes: int) -> list[Construct]:
        """Each non-empty pair (u, y) split for the branches (``references.split_pair``): at the
        answer template, with suffix starts at u's line and keyword starts."""
        out = []
        for u, y in pairs:
            ids = [*u, *y]
            texts = token_texts(self.tokenizer, ids)
            bounds = keyword_boundaries(texts, 0, len(ids), keywords)
            split = split_pair(ids, texts, self.answer_template, bounds, max_suffixes)
            if split is not None:
                out.append(split)
        return out

    def check_ids(self, group: RolloutGroup) -> None:
        """``RecordError`` when a token id of ``group`` lies outside the scorer's vocabulary."""
        check_vocabulary(group.token_arrays(), self.model.get_input_embeddings().weight.shape[0], "the scorer's")

    def opens_thought(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt opens the thought (its chat template ends it with ``think_start``,
        DeepSeek-R1-Distill style): its completions then hold only the closing tag."""
        return opens_thought(prompt_ids, self.tokenizer, self.think_start)

    def content_end(self, ids: Sequence[int]) -> int:
        """The length of ``ids`` without its trailing end tokens (EOS, end of turn)."""
        return content_end(ids, self.end_ids)

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Accept a weight update (e.g. the policy at ``version`` when ``credit.scorer.model=policy``).

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
