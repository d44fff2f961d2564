"""MC continuation service: ``common.sampling.ContinuationSampler`` on the vLLM adapter.

``sample`` returns ``m`` continuations per prefix (one vLLM request with ``n = m`` per prefix, so
the prefix is prefilled once and shared); ``rewards`` also verifies each continued completion
against the gold answer. The engine must be dedicated to this service (``Engine.run`` drains every
request it holds).
"""

from __future__ import annotations

from rredcot.actors.engine import Engine, Sampling
from rredcot.common.verifier import Verifier


class VLLMContinuations:
    """Samples continuations of prompt ⊕ partial-completion prefixes with the engine's current weights."""

    def __init__(self, engine: Engine, temperature: float = 1.0, top_p: float = 1.0) -> None:
        self.engine, self.temperature, self.top_p = engine, temperature, top_p
        self._calls = 0

    def sample(self, prefixes: list[list[int]], m: int, max_tokens: int) -> list[list[list[int]]]:
        """For each prefix, ``m`` continuations (ids after the prefix) of at most ``max_tokens`` tokens."""
        self._calls += 1
        greedy = self.temperature == 0.0  # vLLM refuses n > 1 when greedy: sample once, repeat
        sampling = Sampling(n=1 if greedy else m, temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens)
        groups = self.engine.generate(prefixes, sampling, prefix=f"mc{self._calls}")
        return [[c.token_ids for c in g.completions] * (m if greedy else 1) for g in groups]

    def rewards(
        self,
        prefixes: list[list[int]],
        prompt_lens: list[int],
        answers: list[str],
        m: int,
        max_tokens: int,
        verifier: Verifier,
    ) -> list[list[float]]:
        """Verified reward of each continued completion (partial completion ⊕ continuation)."""
        out = []
        tok = self.engine.tokenizer
        for prefix, plen, answer, conts in zip(
            prefixes, prompt_lens, answers, self.sample(prefixes, m, max_tokens), strict=True
        ):
            texts = (tok.decode(prefix[plen:] + c, skip_special_tokens=True) for c in conts)
            out.append([verifier.score(t, answer).reward for t in texts])
        return out
