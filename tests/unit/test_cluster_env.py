"""``deploy/ray/cluster_env.sh``'s ``rredcot_auth_mode``: a node joining a cluster asks the head which
Ray authentication it uses (its probe run without a token) unless ``RAY_AUTH_MODE`` is set; a head
that cannot be asked leaves the choice to the user, in one line. The probes here stand in for
``ray status --address HEAD:PORT`` (the real one runs in ``tests/cluster``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "ray" / "cluster_env.sh"
REFUSED = "echo 'Authentication required: set RAY_AUTH_TOKEN' >&2; exit 1"


def auth_mode(probe: str, **env: str) -> subprocess.CompletedProcess:
    """``rredcot_auth_mode bash -c PROBE`` in a shell that sourced the script; prints RAY_AUTH_MODE and
    what the probe saw of it."""
    line = f'source {SCRIPT} && rredcot_auth_mode bash -c "$PROBE" && echo "mode=$RAY_AUTH_MODE"'
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run(
        ["bash", "-c", line], env={**base, "PROBE": probe, **env}, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("probe", "mode", "how"),
    [
        ('[ "$RAY_AUTH_MODE" = disabled ]', "disabled", "the head answers without a token"),
        (REFUSED, "token", "the head wants a token"),
    ],
)
def test_the_mode_is_asked_of_the_head_without_a_token(probe: str, mode: str, how: str) -> None:
    done = auth_mode(probe)
    assert done.returncode == 0 and done.stdout.strip() == f"mode={mode}", done
    assert f"rredcot: Ray authentication {mode} ({how};" in done.stderr


def test_a_mode_that_is_set_is_kept_without_asking() -> None:
    done = auth_mode("exit 1", RAY_AUTH_MODE="token")  # a probe that would fail if it were run
    assert done.stdout.strip() == "mode=token" and "Ray authentication token (set;" in done.stderr


def test_a_head_that_does_not_answer_leaves_the_choice_to_the_user_in_one_line() -> None:
    done = auth_mode("echo 'connection refused' >&2; exit 1")
    said = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "mode=" not in done.stdout
    assert len(said) == 1 and said[0].startswith("rredcot: could not ask the head which Ray authentication it uses")
    assert said[0].endswith("connection refused); set RAY_AUTH_MODE=token or RAY_AUTH_MODE=disabled")
