"""The generator actor: admitted prompts → vLLM groups → verified ``RolloutGroup`` entries in Redis.

Loop: apply the newest published weights (``transports``) → admit prompts while the shared
staleness counter allows (``common.staleness``; the admission index is also the dataset position)
→ one engine step → verify and write every finished group to ``stream:rollouts`` (blocking while
the stream is full). Ids are derived from (run, admission index, sample), so a group that is
generated twice after a crash carries the same ids and the learner's de-duplication drops it.

Crash safety: each generator keeps the admission indices it holds in a Redis set
(``rredcot:<run>:inflight:<name>``): the admission script adds the index, the group's XADD is
followed by its removal. A restarted generator of the same name re-generates those first, with the
latest weights; generator 0 also takes over the sets of generators a resumed run no longer has. An
index in the set that this generator does not hold (a reply lost to a dropped connection, whose
retry admitted a second index) is adopted and generated too.

A generator whose share of the run's budget is admitted stays until the learner has consumed the
whole budget: a group that a redistributor or the learner dead-letters frees its admission slot
(``common.staleness``), and some generator must fill it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from rredcot.actors.data_digest import checked_split
from rredcot.actors.engine import Engine, EngineSpec, GroupOutput, PromptTooLong, Sampling
from rredcot.actors.group_filter import UniformGroups
from rredcot.actors.prompt_fit import PromptFit
from rredcot.actors.retirement import Retirement, solved
from rredcot.actors.rollouts import rollout_group
from rredcot.common.codec import encode
from rredcot.common.config import Config
from rredcot.common.heap import trim_heap
from rredcot.common.ledger import group_id, inflight_key, mean_length
from rredcot.common.overlong import overlong_window, penalize
from rredcot.common.records import RecordError, RolloutGroup
from rredcot.common.run_context import RunContext
from rredcot.common.staleness import Admission
from rredcot.common.streams import ROLLOUTS, Producer, key, registered_keys, run_key
from rredcot.tasks.data import Problem, ProblemOrder
from rredcot.tasks.prompts import prompt_ids
from rredcot.tasks.verifier import Verifier
from rredcot.transports import weight_receiver

log = logging.getLogger(__name__)


@dataclass
class GeneratorMetrics:
    """Counters of one generator; ``snapshot`` adds the derived rates."""

    admitted: int = 0
    finished_groups: int = 0
    rejected_too_long: int = 0
    rejected_invalid: int = 0  # groups whose record failed validation (NaN/inf log-probs)
    dropped_uniform: int = 0  # groups whose samples all got one reward (generation.drop_uniform_groups)
    dropped_solved: int = 0  # of those, groups whose samples were all correct
    retired: int = 0  # problems this generator retired (generation.retire_solved)
    skipped_retired: int = 0  # admissions of a retired problem, rejected before the engine saw them
    samples: int = 0
    truncated: int = 0
    overlong_penalized: int = 0  # samples whose reward the overlong penalty lowered (generation.overlong=penalty)
    overlong_penalty_sum: float = 0.0
    verifier_timeouts: int = 0  # samples whose check outlived generation.verifier_timeout_s: reward 0
    verifier_errors: int = 0  # samples whose check raised or crashed the verifier process: reward 0
    reward_sum: float = 0.0
    tokens: int = 0
    generate_s: float = 0.0  # wall time inside engine steps
    blocked_staleness_s: float = 0.0
    blocked_backpressure_s: float = 0.0
    weight_updates: int = 0
    weight_update_s: float = 0.0
    weight_files_missing: int = 0  # versions whose weight file this node could not find (no shared run.dir)
    version: int = 0

    def snapshot(self) -> dict[str, float]:
        out: dict[str, float] = asdict(self)
        out["tokens_per_s"] = self.tokens / self.generate_s if self.generate_s else 0.0
        out["truncation_rate"] = self.truncated / self.samples if self.samples else 0.0
        out["reward_mean"] = self.reward_sum / self.samples if self.samples else 0.0
        return out


class Generator:
    """One generator: an engine, a verifier and the run's Redis state."""

    def __init__(self, cfg: Config, name: str = "gen0", rank: int = 0, engine: Engine | None = None) -> None:
        """``rank``: this generator's index in its tier (its weight receiver's rank)."""
        run = RunContext.connect(cfg, "a generator")
        self.cfg, self.name, self.rank, self.run_id = cfg, name, rank, run.run_id
        self.client, self.control, self.ledger, self.lineage = run.client, run.control, run.ledger, run.lineage
        self.admission = Admission(
            self.client,
            self.run_id,
            cfg.generation.prompts_per_step,
            cfg.staleness.eta,
            budget=cfg.run.steps * cfg.generation.prompts_per_step,
        )
        rollouts = run_key(self.client, self.run_id, ROLLOUTS)
        self.producer = Producer(self.client, rollouts, cfg.redis.maxlen, cfg.redis.block_timeout_s)
        self.inflight_key = inflight_key(self.client, self.run_id, name)
        self.verifier = Verifier.from_config(cfg)
        self.task = self.verifier.task
        # data.path's rows as the run's first start read them, or a DatasetError
        train, _ = checked_split(self.client, self.run_id, self.task, cfg.data, cfg.run.seed)
        self.order = ProblemOrder(train, cfg.data.shuffle_seed)
        self.pool = len({p.id for p in train})  # distinct problems
        self.uniform_groups = UniformGroups(cfg.generation.drop_uniform_groups, self.pool, name)
        g = cfg.generation
        self.retirement = Retirement(self.client, self.run_id, g.retire_solved, self.pool, floor=g.prompts_per_step)
        self.prompt_fit = PromptFit(self.pool, cfg.model.max_model_len)
        self.engine = engine or Engine(EngineSpec.from_config(cfg, gpus=cfg.cluster.gpus_per_generator))
        self.sampling = Sampling(
            n=g.group_size, temperature=g.temperature, top_p=g.top_p, max_tokens=g.max_tokens, stop=tuple(g.stop)
        )
        self.metrics = GeneratorMetrics(version=self.engine.version)
        self._problems: dict[str, tuple[int, Problem]] = {}
        self.receiver = weight_receiver(cfg, self.client, self.engine, rank)

    # ----- weights -----
    def sync_weights(self) -> bool:
        """Apply the newest published weights if they are newer than the engine's; True if applied."""
        in_flight = self.cfg.generation.in_flight
        if in_flight == "pause" and self.lineage.restored_after(self.engine.version):
            # a restored learner's (older) policy: running requests finish on the newer one, as their
            # tokens so far, or they would be trained more than η updates after the policy that sampled them
            in_flight = "finish"
        applied = self.receiver.poll(in_flight)
        if applied is None:
            if self.receiver.missing_files != self.metrics.weight_files_missing:
                self.metrics.weight_files_missing = self.receiver.missing_files
                self.control.publish_metrics(self.name, "generator", self.metrics.snapshot())
            return False
        version, seconds = applied
        trim_heap()  # the update's file bytes and tensors are freed: their pages would stay with glibc
        self._write_finished(self.engine.step())  # groups drained by the "finish" policy
        self.metrics.weight_updates += 1
        self.metrics.weight_update_s += seconds
        self.metrics.version = version
        self.control.publish_metrics(self.name, "generator", self.metrics.snapshot())
        return True

    # ----- admission -----
    def resume(self) -> int:
        """Re-submit the prompts this generator had admitted but not written before a restart
        (generator 0 first takes over those of generators the run no longer has)."""
        if self.rank == 0:
            self._adopt_orphaned_sets()
        return self._submit_unheld()

    def _adopt_orphaned_sets(self) -> None:
        """Move the in-flight indices of generators beyond ``cluster.generators`` (a run resumed
        with fewer) into this generator's set."""
        prefix = key(self.run_id, "inflight:gen")
        for k in registered_keys(self.client, self.run_id):
            rank = k.removeprefix(prefix)
            if k.startswith(prefix) and rank.isdigit() and int(rank) >= self.cfg.cluster.generators:
                for index in self.client.smembers(k):
                    self.client.smove(k, self.inflight_key, index)

    def _submit_unheld(self) -> int:
        """Submit the indices of this generator's in-flight set that it does not hold yet."""
        held = {index for index, _ in self._problems.values()}
        unheld = sorted({int(i) for i in self.client.smembers(self.inflight_key)} - held)
        for index in unheld:
            self._submit(index)
        return len(unheld)

    def fill(self) -> int:
        """Admit and submit prompts while staleness and the local in-flight cap allow."""
        added = 0
        while not self.admission.exhausted and self.engine.num_unfinished < self.cfg.generation.max_in_flight_groups:
            index = self.admission.try_admit(self.inflight_key)
            if index is None:  # staleness forbids one now, or the run's budget is admitted
                break
            self.sync_weights()  # the learner may have published between the loop's sync and this admission
            self.metrics.admitted += 1
            added += self._submit(index)
        if added and self.client.scard(self.inflight_key) != len(self._problems):
            added += self._submit_unheld()
        return added

    def _submit(self, index: int) -> int:
        problem = self.order.at(index)
        if self.retirement.is_retired(problem.id):  # solved often enough: another prompt takes its slot
            self.metrics.skipped_retired += 1
            self._reject(index, problem, None, "retired")
            return 0
        ids = prompt_ids(problem, self.task, self.cfg.data, self.engine.tokenizer)
        rid = group_id(self.run_id, index)
        try:
            self.engine.submit(rid, ids, self.sampling)
        except PromptTooLong as e:
            self.metrics.rejected_too_long += 1
            self._reject(index, problem, e, "too_long")
            self.prompt_fit.too_long(problem.id, len(ids))  # raises when every training prompt is too long
            return 0
        self.prompt_fit.fits()
        self._problems[rid] = (index, problem)
        return 1

    def _reject(self, index: int, problem: Problem, why: Exception | None, reason: str, length: int = 0) -> None:
        """An admitted prompt that yields no group: free its slot, so the learner still gets a full step.
        ``length``: the mean completion length of a group generated and then dropped."""
        self.ledger.record("rejected", {group_id(self.run_id, index): length}, reason)  # frees its admission slot
        self.admission.reopen()
        if why is not None:  # a fault to look at, not a dropped uniform group (dynamic sampling's routine)
            log.warning("generator %s: rejected problem %s: %s", self.name, problem.id, why)
        self.client.srem(self.inflight_key, index)

    # ----- output -----
    def _write_finished(self, groups: list[GroupOutput]) -> None:
        for group in groups:
            index, problem = self._problems.pop(group.request_id)
            try:
                record = self._record(group, index, problem)
                all_correct = solved([s.verdict for s in record.samples])
                self.metrics.retired += self.retirement.observe(problem.id, all_correct)
                self.uniform_groups.pool = self.pool - self.retirement.retired()  # the problems still drawn
                if self.uniform_groups.drop([s.reward for s in record.samples]):  # before paying for its encoding
                    self.metrics.dropped_uniform += 1
                    self.metrics.dropped_solved += all_correct
                    length = mean_length([s.completion_ids for s in record.samples])
                    self._reject(index, problem, None, "uniform_solved" if all_correct else "uniform", length)
                    continue
                data = encode(record)
            except RecordError as e:  # e.g. a NaN log-prob from the engine: the learner cannot use it
                self.metrics.rejected_invalid += 1
                self._reject(index, problem, e, "invalid")
                continue
            before = self.producer.blocked_s
            self.producer.put(data)
            self.metrics.blocked_backpressure_s += self.producer.blocked_s - before
            self.client.srem(self.inflight_key, index)
            self.metrics.finished_groups += 1
        if groups:
            self.control.publish_metrics(self.name, "generator", self.metrics.snapshot())

    def _record(self, group: GroupOutput, index: int, problem: Problem) -> RolloutGroup:
        record = rollout_group(group, problem, index, self.run_id, self.task, self.engine.tokenizer, self.verifier)
        if self.cfg.generation.overlong == "penalty":
            penalties = penalize(record.samples, self.cfg.generation.max_tokens, overlong_window(self.cfg))
            self.metrics.overlong_penalized += sum(p < 0 for p in penalties)
            self.metrics.overlong_penalty_sum += sum(penalties)
        for s in record.samples:
            self.metrics.samples += 1
            self.metrics.truncated += s.finish_reason == "length"
            self.metrics.verifier_timeouts += s.verdict == "timeout"
            self.metrics.verifier_errors += s.verdict == "error"
            self.metrics.reward_sum += s.reward
        return record

    # ----- loop -----
    def step(self) -> int:
        """One loop iteration; returns the number of groups written (0 while blocked)."""
        self.sync_weights()
        self.fill()
        if not self.engine.num_unfinished:
            if not self.admission.exhausted:
                time.sleep(self.cfg.generation.idle_poll_s)
                self.metrics.blocked_staleness_s += self.cfg.generation.idle_poll_s
            return 0
        start = time.perf_counter()
        groups = self.engine.step()
        self.metrics.generate_s += time.perf_counter() - start
        self.metrics.tokens = self.engine.generated_tokens
        self._write_finished(groups)
        return len(groups)

    @property
    def done(self) -> bool:
        return self.admission.exhausted and not self.engine.num_unfinished

    def run(
        self, max_groups: int | None = None, timeout_s: float | None = None, linger: bool = True
    ) -> dict[str, float]:
        """Load the latest weights, resume held prompts, then loop until the run's prompt budget is
        generated, the run's stop flag is raised, or ``max_groups`` / the timeout is reached.
        ``linger``: once its budget is admitted and generated, stay (and fill any slot a dead letter
        frees) until the learner has consumed the whole budget; off where no learner runs."""
        self.sync_weights()
        self.resume()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while max_groups is None or self.metrics.finished_groups < max_groups:
            if deadline is not None and time.monotonic() > deadline:
                break
            if self.control.stop_requested():
                break
            if not self.done:
                self.step()
            elif linger and not self.admission.all_consumed():
                self._linger()
            else:
                break
        while self.done and self.receiver.holds_group and not self.control.stop_requested():
            if not self.sync_weights():  # stay until the learner has sent its last version
                time.sleep(self.cfg.generation.idle_poll_s)
        return self.metrics.snapshot()

    def _linger(self) -> None:
        """Idle with the budget generated: admit into a slot that a dead letter freed, if any. The
        weights are applied only then (``fill``), or on every version while a weight group needs
        this generator in its collectives."""
        if self.receiver.holds_group:
            self.sync_weights()
        self._submit_unheld()
        self.admission.reopen()
        if not self.fill():
            time.sleep(self.cfg.generation.idle_poll_s)

    def close(self) -> None:
        self.receiver.close()
        self.verifier.close()
        self.client.close()
