"""A generator stage actor killed mid-group is restarted by Ray and resumes from the latest weights."""

from __future__ import annotations

import time

from rredcot.common.codec import decode
from rredcot.common.config import load_config, to_dict
from rredcot.common.ledger import group_id
from rredcot.common.records import RolloutGroup
from rredcot.common.staleness import Admission
from rredcot.common.streams import ROLLOUTS, key
from rredcot.launch.stages import StageWorker, stage_env
from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir, save_model_dir
from rredcot.models.tiny import build_tiny_model
from rredcot.transports.manifest import publish_weights


def test_killed_generator_resumes_with_latest_weights_and_no_lost_prompts(
    ray_local, redis_server, redis_client, run_id, tmp_path
):
    ray = ray_local
    tok = load_tokenizer(qwen_tokenizer_dir())
    path = str(save_model_dir(build_tiny_model("qwen3", seed=0), tok, tmp_path / "m0"))
    pps, steps = 2, 6
    cfg = load_config(
        "tests",
        [
            f"model.path={path}",
            f"redis.url={redis_server.url}",
            f"run.name={run_id}",
            f"run.dir={tmp_path / 'run'}",
            f"run.steps={steps}",
            f"generation.prompts_per_step={pps}",
            "generation.group_size=2",
            "generation.max_tokens=64",
            "generation.max_in_flight_groups=2",
            "generation.kv_cache_bytes=16777216",
            "staleness.eta=8",
        ],
    )
    admission = Admission(redis_client, run_id, pps, 8)
    weights_dir = tmp_path / "weights"
    for version, seed in ((1, 1), (2, 2)):
        model = build_tiny_model("qwen3", seed=seed)
        if version == 2:  # published while the first incarnation runs, right before the kill
            inflight = key(run_id, "inflight:gen0")
            while redis_client.xlen(key(run_id, ROLLOUTS)) < 2 or not redis_client.scard(inflight):
                time.sleep(0.01)
            held = {int(i) for i in redis_client.smembers(inflight)}
        publish_weights(redis_client, run_id, version, model.named_parameters(), weights_dir)
        admission.publish_version(version)
        if version == 1:
            env = stage_env(cfg, "generator", 0, ("127.0.0.1", "r0"))
            options = {"num_cpus": 1, "max_restarts": 1, "max_task_retries": 1}
            actor = ray.remote(StageWorker).options(**options).remote("generator", to_dict(cfg), 0, env)
            done = actor.run.remote()
    written_before = redis_client.xlen(key(run_id, ROLLOUTS))
    ray.kill(actor, no_restart=False)
    time.sleep(0.5)  # the process is gone, its successor still starting: the set is what it held
    held |= {int(i) for i in redis_client.smembers(key(run_id, "inflight:gen0"))}
    deadline = time.monotonic() + 300
    while (admission.admitted() < pps * steps or redis_client.scard(inflight)) and time.monotonic() < deadline:
        time.sleep(0.05)
    admission.publish_version(steps)  # a learner stand-in consumed the budget: the generator may leave
    metrics = ray.get(done, timeout=60)  # the call is retried on the restarted actor

    assert held, "the actor was killed while holding admitted prompts"
    assert written_before < pps * steps, "the actor was killed before it finished"
    groups = [decode(f[b"d"], expect=RolloutGroup) for _, f in redis_client.xrange(key(run_id, ROLLOUTS))]
    ids = [g.group_id for g in groups]
    assert admission.admitted() == pps * steps
    assert set(ids) == {group_id(run_id, i) for i in range(pps * steps)}, "an admitted prompt was lost"
    dupes = {i for i in range(pps * steps) if ids.count(group_id(run_id, i)) > 1}
    assert dupes <= held, "only prompts the in-flight record held may be generated twice"
    assert redis_client.scard(key(run_id, "inflight:gen0")) == 0
    after = groups[len(groups) - int(metrics["finished_groups"]) :]  # written by the restarted incarnation
    assert after and all(s.version_runs.tolist() == [[0, 2]] for g in after for s in g.samples)
    assert metrics["weight_updates"] >= 1 and metrics["version"] == 2
