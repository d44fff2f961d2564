"""Multi-process learner tests (real DeepSpeed, gloo): exact resume, two ranks, weight broadcast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rredcot.common.net import free_port
from rredcot.learner.checkpoint_dirs import latest_checkpoint
from rredcot.transports.manifest import latest_manifest, load_tensors

ROOT = Path(__file__).resolve().parents[2]  # the repository: the worker runs as tests.integration.learner_worker


def run_ranks(spec: dict, world: int = 1, timeout: float = 240) -> None:
    """Run the worker as ``world`` ranks. One rank picks its own port as it starts its group; several
    share one picked here (a port picked ahead can be taken meanwhile: keep that to the one test)."""
    shared = {"MASTER_PORT": str(free_port())} if world > 1 else {}
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"} | shared
        env |= {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.integration.learner_worker", json.dumps(spec)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            assert p.returncode == 0, out[-4000:]
    finally:
        for p in procs:  # a rank left waiting in a collective
            p.kill()


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


def test_resume_is_exact(tmp_path):
    """4 steps straight == 2 steps, checkpoint, new process, 2 more steps."""
    half_way = {"save_at": 2, "save": str(tmp_path / "ckpt"), "save_out": str(tmp_path / "half.safetensors")}
    run_ranks({"stage": 2, "steps": 4, "out": str(tmp_path / "straight.safetensors"), **half_way})
    ckpt = latest_checkpoint(tmp_path / "ckpt")
    assert ckpt is not None and ckpt.name == "step-00000002"
    run_ranks(
        {"stage": 2, "steps": 4, "first_step": 2, "resume": str(ckpt), "out": str(tmp_path / "resumed.safetensors")}
    )
    straight = load_file(tmp_path / "straight.safetensors")
    assert_same(straight, load_file(tmp_path / "resumed.safetensors"), atol=1e-6)
    half = load_file(tmp_path / "half.safetensors")
    assert max((straight[n] - half[n]).abs().max() for n in half) > 1e-4  # steps 3-4 did change weights
    # the checkpoint's HF directory loads in transformers with the trained weights
    hf = AutoModelForCausalLM.from_pretrained(ckpt / "hf")
    assert_same({n: p.detach() for n, p in hf.named_parameters()}, half, atol=0)


def assert_ranks_agree_and_broadcast_matches(out: Path, redis_client, run_id: str, stage: int, chunk: int) -> None:
    """The two ranks' final weights (``out``/rank0, rank1) are equal, are the last version published
    (3), and equal one rank's training of the same 3 steps."""
    manifest = latest_manifest(redis_client, run_id)
    r0, r1 = load_file(out / "rank0.safetensors"), load_file(out / "rank1.safetensors")
    assert_same(r0, r1, atol=0)
    assert manifest is not None and manifest.version == 3
    assert_same(load_tensors(manifest), r0, atol=0)  # checksum verified inside load_tensors
    run_ranks({"stage": stage, "chunk": chunk, "steps": 3, "out": str(out / "single.safetensors")})
    assert_same(load_file(out / "single.safetensors"), r0, atol=2e-5)


def test_two_ranks_agree_and_broadcast_matches(tmp_path, redis_server, redis_client, run_id):
    """Two ZeRO-2 ranks == one rank, and the weights they publish are theirs."""
    spec = {"stage": 2, "chunk": 4096, "steps": 3, "out": str(tmp_path / "rankRANK.safetensors")}
    run_ranks({**spec, "run_id": run_id, "redis_url": redis_server.url, "weights_dir": str(tmp_path / "weights")}, 2)
    assert_ranks_agree_and_broadcast_matches(tmp_path, redis_client, run_id, 2, 4096)


@pytest.fixture(scope="module")
def zero3_ranks(module_dir, redis_server) -> SimpleNamespace:
    """Two ZeRO-3 ranks with a small LM-head chunk, 3 steps, publishing each version. After step 1,
    two checkpoints that one rank cannot write (rank 0's writes fail, then rank 1's; a file-size
    limit stands in for its full disk), then one that both write. One pair of ranks for the tests
    below: each start of a rank is a DeepSpeed start."""
    out, run_id = module_dir / "zero3", f"t{uuid.uuid4().hex[:10]}"
    out.mkdir()
    run_ranks(
        {
            "stage": 3,
            "chunk": 8,
            "steps": 3,
            "out": str(out / "rankRANK.safetensors"),
            "run_id": run_id,
            "redis_url": redis_server.url,
            "weights_dir": str(out / "weights"),
            "save_at": 1,
            "save": str(out / "ckpt"),
            "save_out": str(out / "half.safetensors"),
            "fail_ranks": [0, 1],
            "errors": str(out / "errorFAIL-RANK.txt"),
        },
        world=2,
    )
    return SimpleNamespace(out=out, run_id=run_id)


def test_two_zero3_ranks_agree_and_broadcast_matches(zero3_ranks, redis_client):
    """Two ZeRO-3 ranks == one rank. With a small LM-head chunk the ranks' micro-batches hold
    different token counts, so they would call the head (a weight all-gather each) unequally often
    and hang, unless the calls are agreed per micro-batch."""
    assert_ranks_agree_and_broadcast_matches(zero3_ranks.out, redis_client, zero3_ranks.run_id, 3, 8)


@pytest.mark.parametrize("fail_rank", [0, 1])
def test_a_checkpoint_that_one_rank_cannot_write_fails_on_every_rank(zero3_ranks, fail_rank):
    """Two ZeRO-3 ranks; one cannot write its part of the step-1 checkpoint: both raise
    CheckpointError and no partial directory is left; the ranks are still in step, so the next
    checkpoint of step 1 is written (its HF weights, which rank 0 gathers with rank 1 taking part,
    are the trained ones) and the later steps train alike on both (``zero3_ranks``: rank 0 fails,
    then rank 1, in the same ranks). Before, that rank raised alone (and removed the directory the
    other was writing) and went on to the next collective while the other waited in DeepSpeed's save."""
    out = zero3_ranks.out
    errors = [(out / f"error{fail_rank}-{rank}.txt").read_text() for rank in range(2)]
    assert all(e.startswith("could not write checkpoint step-00000001") for e in errors)
    assert ["another learner rank could not write its part" in e for e in errors] == [r != fail_rank for r in range(2)]
    assert [p.name for p in (out / "ckpt").iterdir()] == ["step-00000001"]
    hf = AutoModelForCausalLM.from_pretrained(out / "ckpt" / "step-00000001" / "hf")
    assert_same({n: p.detach() for n, p in hf.named_parameters()}, load_file(out / "half.safetensors"), atol=0)
    assert_same(load_file(out / "rank0.safetensors"), load_file(out / "rank1.safetensors"), atol=0)
