"""The redistributor worker: ``rollouts`` → advantages + credit → ``batches``.

Each rollouts entry is one whole group (the generator writes a group's G samples together), so a
group is never split across workers. An entry is acknowledged only after its ``WeightedGroup`` is
in the batches stream (at-least-once; the learner de-duplicates by rollout id); entries a crashed
worker held are reclaimed by the others (XAUTOCLAIM in ``Consumer.read``). An entry that is at
fault goes to the dead-letter stream with the reason: it does not decode, fails validation, holds
token ids outside the scorer's vocabulary, or makes the credit computation raise ``ValueError``. So
every rollout comes out as one weighted sample or one dead letter. Any other error is the worker's,
not the entry's (a CUDA error that poisons the process, an allocation that fails even at the
smallest budget, a compile failure): it propagates, the worker dies with the entry unacked, and
its restart (Ray) or another worker takes the entry up again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rredcot.common.codec import decode, encode
from rredcot.common.config import Config, ConfigError, CreditSpec, resolve_credit
from rredcot.common.ledger import length_bucket, mean_length
from rredcot.common.onednn import bound_primitive_cache
from rredcot.common.records import RecordError, RolloutGroup, WeightedGroup, WeightedSample
from rredcot.common.run_context import RunContext
from rredcot.common.sampling import ContinuationSampler, RewardFn
from rredcot.common.streams import BATCHES, DEAD, ROLLOUTS, Consumer, Entry, Producer, run_key
from rredcot.models.store import load_causal_lm, load_tokenizer, resolve_model_path
from rredcot.redistributor.blame import SlipBlame, SlipChecker, takes_blame
from rredcot.redistributor.credit import redistribute_group
from rredcot.redistributor.mc import HFContinuationSampler
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.scorer_weights import ScorerPort
from rredcot.tasks.task import build_task
from rredcot.tasks.verifier import Verifier
from rredcot.transports import weight_receiver

log = logging.getLogger(__name__)
GROUP = "redistributors"
STAGES = ("entropy", "segment", "values", "sigma")


@dataclass
class WorkerMetrics:
    groups: int = 0
    rollouts: int = 0
    tokens: int = 0
    dead_letters: int = 0
    incomplete_groups: int = 0
    zero_advantage_groups: int = 0  # all rewards equal: σ uniform, no scorer work
    busy_s: float = 0.0
    queue_lag_s: float = 0.0  # age of the last entry when it was read
    scorer_version: int = 0
    entropy_s: float = 0.0
    segment_s: float = 0.0
    values_s: float = 0.0
    sigma_s: float = 0.0
    oom_retries: int = 0  # scorer passes redone with half the token budget after running out of memory
    scorer_trace_tokens: int = 0  # tokens the scorer forwarded as traces (prompt ⊕ completion)
    scorer_branch_tokens: int = 0  # and as branches after the exit points (the exit values' cost)
    # MC (credit.method=mc): the sampler's policy version, continuation tokens, exit values and the sum
    # of their standard errors; the version gap (sampler version − trace version) per sample
    mc_version: int = -1
    mc_tokens: int = 0
    mc_exits: int = 0
    mc_stderr_sum: float = 0.0
    mc_samples: int = 0
    mc_version_gap_sum: int = 0
    # what σ does (the run report's credit section): segments of the samples the method segmented;
    # the wrong traces taking blame and their max σ·|o| summed; those whose first wrong line the
    # task's checker names, the hits of σ's most blamed line on it (ties share a hit) and 1/lines summed
    segmented_samples: int = 0
    segments: int = 0
    wrong_samples: int = 0
    wrong_sigma_peak_sum: float = 0.0
    slip_named: int = 0
    slip_top_blame: float = 0.0
    slip_top_chance: float = 0.0
    # per completion-length bucket (``length_bucket``) and per dead-letter reason:
    # samples.<b>, uniform_<reason>.<b>, sigma_peak.<b> (max σ·|o|), dead_letters.<reason>,
    # mc_version_gap.<gap> (samples whose MC values came from a policy <gap> versions after the trace's)
    detail: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float = 1.0) -> None:
        self.detail[key] = self.detail.get(key, 0.0) + value

    def count_sample(self, s: WeightedSample, position: Callable[[int], Any], blame: SlipBlame | None = None) -> None:
        """The sample's length bucket, σ fallback reason, σ concentration, segments and, for a wrong
        trace, its σ peak and its ``blame`` on the checker's line; an MC sample's version gap is in
        updates along the run's history (``position``: ``VersionLineage.position``)."""
        n = len(s.sigma)
        b = length_bucket(n)
        self.add(f"samples.{b}")
        if s.sigma_fallback:
            self.add(f"uniform_{s.sigma_fallback}.{b}")
        if n:
            peak = float(s.sigma.max()) * n
            self.detail[f"sigma_peak.{b}"] = max(self.detail.get(f"sigma_peak.{b}", 0.0), peak)
            if takes_blame(s.rollout, s.advantage):
                self.wrong_samples += 1
                self.wrong_sigma_peak_sum += peak
        if len(s.exit_points) > 1:
            self.segmented_samples += 1
            self.segments += len(s.exit_points) - 1
        if blame is not None:
            self.slip_named += 1
            self.slip_top_blame += blame.top
            self.slip_top_chance += 1 / blame.lines
        finite = s.exit_stderr[np.isfinite(s.exit_stderr)]  # MC values, the policy's or a fixed prover's
        self.mc_exits += len(finite)
        self.mc_stderr_sum += float(finite.sum())
        if s.values_version >= 0:  # from the policy: its version gap
            gap = int(position(s.values_version) - position(s.rollout.max_version))
            self.mc_samples += 1
            self.mc_version_gap_sum += gap
            self.add(f"mc_version_gap.{gap}")

    def snapshot(self) -> dict[str, float]:
        out: dict[str, float] = asdict(self)
        out.update(out.pop("detail"))
        out["rollouts_per_s"] = self.rollouts / self.busy_s if self.busy_s else 0.0
        out["tokens_per_s"] = self.tokens / self.busy_s if self.busy_s else 0.0
        out["scorer_branch_per_trace"] = (
            self.scorer_branch_tokens / self.scorer_trace_tokens if self.scorer_trace_tokens else 0.0
        )
        out["mc_stderr_mean"] = self.mc_stderr_sum / self.mc_exits if self.mc_exits else 0.0
        out["mc_version_gap_mean"] = self.mc_version_gap_sum / self.mc_samples if self.mc_samples else 0.0
        return out


def build_scorer(cfg: Config) -> Scorer:
    """The scorer from ``model.path`` (its initial weights are the reference model)."""
    bound_primitive_cache()  # a CPU's bf16 forwards are oneDNN primitives, one per rollout length
    path = resolve_model_path(cfg.model.path, seed=cfg.run.seed)
    tok = load_tokenizer(cfg.model.tokenizer or path)
    model = load_causal_lm(path, cfg.model.dtype)
    if torch.cuda.is_available():  # the plan's gpus_per_redistributor (Ray sets CUDA_VISIBLE_DEVICES)
        model = model.to("cuda")
    elif cfg.credit.scorer.branch_attention == "flex":
        raise ConfigError(
            "credit.scorer.branch_attention = 'flex' needs a CUDA scorer (compiled flex attention); "
            "this redistributor has no GPU: use 'auto' or 'dense'"
        )
    template = build_task(cfg.task).answer_template
    return Scorer(
        model, tok, cfg.credit.scorer.exit_string, cfg.model.think_start, cfg.model.think_end, answer_template=template
    )


def build_tokenizer(cfg: Config) -> Any:
    """The run's tokenizer (``model.tokenizer``, else ``model.path``'s), for a method that reads token
    texts without a scorer (``needs_tokenizer``)."""
    return load_tokenizer(cfg.model.tokenizer or resolve_model_path(cfg.model.path, seed=cfg.run.seed))


def verifier_reward(verifier: Verifier, tokenizer: Any) -> RewardFn:
    """RewardFn for MC: decode, then score with the run's task through the isolated verifier."""

    def reward(ids: list[int], gold: str, opened: bool = False) -> float:
        return verifier.score(tokenizer.decode(ids, skip_special_tokens=True), gold, opened).reward

    return reward


def scorer_sampler(scorer: Scorer, cfg: Config, name: str, prover: str = "policy") -> HFContinuationSampler:
    """The fallback continuation sampler (transformers) when launch wired no engine. ``prover`` (the
    method's declared prover, ``CreditSpec.prover``): ``policy``, the scorer's model (its version is
    the scorer's); ``initial``, model.path's weights, frozen (the scorer's model unless
    ``credit.scorer.model=policy`` moves it); else the model at that path, frozen (version 0)."""
    g = cfg.generation
    model, version = scorer.model, lambda: scorer.version
    if prover != "policy":
        version = lambda: 0
        if prover != "initial" or cfg.credit.scorer.model == "policy":
            path = resolve_model_path(cfg.model.path if prover == "initial" else prover, seed=cfg.run.seed)
            model = load_causal_lm(path, cfg.model.dtype).to(scorer.model.device)
    log.info("%s: no engine wired; continuations come from %s (transformers)", name, prover)
    return HFContinuationSampler(model, g.temperature, g.top_p, scorer.tokenizer.eos_token_id, cfg.run.seed, version)


class Redistributor:
    """One worker of the redistributor tier.

    ``credit``: the run's credit method with its settings and prover (``stage_parts`` resolves it
    once; resolved here when not given). A method that samples continuations (``mc``, ``progress``)
    takes them from ``sampler``: in a run, launch injects a vLLM engine holding the policy
    (``actors.continuations.VLLMContinuations``), brought to the newest published version before
    each group, or the method's fixed prover (``progress``: ``credit.settings.progress.prover``).
    Without one (unit tests, benchmarks) they are sampled with transformers (``scorer_sampler``): for
    ``mc`` by the scorer, not the policy unless ``credit.scorer.model=policy``.
    """

    def __init__(
        self,
        cfg: Config,
        name: str = "red0",
        rank: int = 0,
        scorer: Scorer | None = None,
        sampler: ContinuationSampler | None = None,
        credit: CreditSpec | None = None,
    ) -> None:
        run = RunContext.connect(cfg, "a redistributor")
        self.cfg, self.name, self.run_id = cfg, name, run.run_id
        self.credit = credit = credit or resolve_credit(cfg)
        self.client, self.control, self.ledger, self.lineage = run.client, run.control, run.ledger, run.lineage
        rollouts, dead, batches = (run_key(self.client, self.run_id, k) for k in (ROLLOUTS, DEAD, BATCHES))
        self.consumer = Consumer(self.client, rollouts, GROUP, name, dead, cfg.redis.claim_idle_ms)
        self.producer = Producer(self.client, batches, cfg.redis.maxlen, cfg.redis.block_timeout_s)
        self.scorer = scorer if scorer is not None or not credit.method.needs_scorer else build_scorer(cfg)
        # a method that reads token texts without a scorer (oracle), or a task whose slip checker reads
        # the wrong traces' lines (the report's credit section), loads only the tokenizer
        reads_lines = credit.method.needs_tokenizer or build_task(cfg.task).checks_slips
        self.tokenizer = build_tokenizer(cfg) if reads_lines and self.scorer is None else None
        self.checker = SlipChecker.of(cfg, self.tokenizer if self.scorer is None else self.scorer.tokenizer)
        following = cfg.credit.scorer.model == "policy" and self.scorer is not None
        self.scorer_weights = (
            weight_receiver(cfg, self.client, ScorerPort(self.scorer), name=name) if following else None
        )
        self.verifier: Verifier | None = None
        self.sampler: ContinuationSampler | None = None
        self.reward_fn: RewardFn | None = None
        if credit.prover is not None and self.scorer is not None:
            self.sampler = sampler or scorer_sampler(self.scorer, cfg, name, credit.prover)
            self.verifier = Verifier.from_config(cfg)
            self.reward_fn = verifier_reward(self.verifier, self.scorer.tokenizer)
        self.metrics = WorkerMetrics()
        self.saved = 0
        self._resumed = False

    def sync_scorer(self) -> bool:
        """With ``credit.scorer.model=policy``, load the newest published policy weights through the run's
        weight transport; True if a version was applied."""
        applied = self.scorer_weights.poll() if self.scorer_weights is not None else None
        if applied is None:
            return False
        self.metrics.scorer_version = applied[0]
        return True

    def step(self, block_ms: int = 1000) -> int:
        """Process this worker's own unacked entries (after a restart), else read one; returns how many.
        One at a time: a group held in a batch waits behind the others while idle peers find the stream
        empty, and with long traces it can outlive ``claim_idle_ms`` and be scored twice (reclaimed)."""
        self.sync_scorer()
        entries = [] if self._resumed else self.consumer.pending_mine()
        self._resumed = True
        entries = entries or self.consumer.read(count=1, block_ms=block_ms)
        for entry in entries:
            self._process(entry)
        if entries:
            self.control.publish_metrics(self.name, "redistributor", self.metrics.snapshot())
        return len(entries)

    def _process(self, entry: Entry) -> None:
        self.metrics.queue_lag_s = max(0.0, time.time() - int(entry.id.split(b"-")[0]) / 1000)
        self._sync_sampler()
        if entry.payload is None:
            self._dead(entry, "entry has no payload", "no_payload")
            return
        t0 = time.perf_counter()
        group = None
        try:
            group = decode(entry.payload, RolloutGroup)
            with torch.inference_mode():
                out = redistribute_group(
                    group, self.cfg, self.scorer, self.credit, self.sampler, self.reward_fn, self.tokenizer
                )
            payload = encode(out)
        except (RecordError, ValueError) as e:  # the entry's fault; anything else is the worker's
            self._dead(entry, f"{type(e).__name__}: {e}", type(e).__name__, group)
            return
        self.producer.put(payload)
        self.consumer.ack([entry.id])
        self._count(group, out.samples, time.perf_counter() - t0)
        self._maybe_save(out, payload, entry.payload)

    def _sync_sampler(self) -> None:
        """Bring the continuation sampler to the newest published policy version (between groups)."""
        if self.sampler is not None:
            self.sampler.sync()
            if self.sampler.version != self.metrics.mc_version:  # a restored learner renumbers first
                self.lineage.refresh()
            self.metrics.mc_version = self.sampler.version

    def _dead(self, entry: Entry, reason: str, kind: str, group: RolloutGroup | None = None) -> None:
        if group is None:  # unreadable: the ledger keeps it under its entry id
            self.ledger.record_unreadable(entry.id, kind)
        else:
            self.ledger.record("dead", {group.group_id: mean_length(s.completion_ids for s in group.samples)}, kind)
        self.consumer.dead_letter(entry, reason)
        self.metrics.dead_letters += 1
        self.metrics.add(f"dead_letters.{kind}")

    def _maybe_save(self, out: WeightedGroup, payload: bytes, rollouts: bytes) -> None:
        """Keep the first ``credit.save_traces`` groups with a non-zero advantage under
        ``run.dir/traces``: the weighted group (``rredcot inspect``, the run report) and the rollout
        group it came from (under ``traces/rollouts``, for ``rredcot study credit``), encoded."""
        if self.saved >= self.cfg.credit.save_traces or not any(s.advantage for s in out.samples):
            return
        folder = Path(self.cfg.run.dir) / "traces"
        try:
            (folder / "rollouts").mkdir(parents=True, exist_ok=True)
            (folder / f"{self.name}-{out.group_id}.msgpack").write_bytes(payload)
            (folder / "rollouts" / f"{self.name}-{out.group_id}.msgpack").write_bytes(rollouts)
        except OSError as e:  # a full disk: the traces are for the report, the run goes on without more
            why = e.strerror or str(e)
            log.warning("%s: could not save a trace in %s (%s): no more traces saved this run", self.name, folder, why)
            self.saved = self.cfg.credit.save_traces
            return
        self.saved += 1

    def _count(self, group: RolloutGroup, samples: list[WeightedSample], seconds: float) -> None:
        m = self.metrics
        m.groups += 1
        m.rollouts += len(samples)
        m.tokens += sum(len(s.rollout.completion_ids) for s in samples)
        m.busy_s += seconds
        m.zero_advantage_groups += not any(s.advantage for s in samples)
        if self.scorer is not None:
            m.oom_retries = self.scorer.tokens.oom_retries
            m.scorer_trace_tokens, m.scorer_branch_tokens = self.scorer.tokens.trace, self.scorer.tokens.branch
        if self.sampler is not None:
            m.mc_tokens = self.sampler.generated_tokens
        for s in samples:
            m.count_sample(s, self.lineage.position, self.checker.blame(s, group.prompt_id) if self.checker else None)
        if len(group.samples) < self.cfg.generation.group_size:
            m.incomplete_groups += 1
            log.warning(
                "group %s has %d of %d samples; redistributed as is",
                group.group_id,
                len(group.samples),
                self.cfg.generation.group_size,
            )
        for stage in STAGES:
            setattr(m, f"{stage}_s", getattr(m, f"{stage}_s") + sum(s.timings.get(stage, 0.0) for s in samples))

    def run(self, idle_exit_s: float | None = None) -> dict[str, float]:
        """Process until the run's stop flag is set (or nothing arrived for ``idle_exit_s``); returns
        the worker's metrics."""
        idle_since = time.monotonic()
        try:
            while not self.control.stop_requested():
                if self.step():
                    idle_since = time.monotonic()
                elif idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                    break
        finally:
            if self.verifier is not None:
                self.verifier.close()
        return self.metrics.snapshot()
