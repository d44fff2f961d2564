"""What the suite's scheduler (``tests/conftest.py``) runs in turn: the whole runs, one at a time on one
worker, while the other worker takes the rest file by file. Apart from the conftest, so that a tool
reading test ids (``bench/suite_census.py``) need not import torch for it."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).parent
SLOW_FOLDERS = {"integration", "fault", "gpu", "cluster"}  # real services, whole runs, GPUs
# slow tests with no Ray and no whole run (services in the test's process, or learner ranks it starts):
# they may run beside a whole run, so the scheduler leaves them to either worker, file by file
BESIDE_RUNS = {
    f"tests/integration/{name}.py"
    for name in (
        "test_bench_credit_quality",
        "test_generator_loop",
        "test_learner_generator",
        "test_learner_ranks",
        "test_learner_trainer",
        "test_mc_policy",
        "test_redistributor_worker",
        "test_streams",
        "test_study_credit",
    )
}


def runs_in_turn(nodeid: str) -> bool:
    """Whether the test is one of the whole runs that the scheduler runs one at a time."""
    path = nodeid.split("::", 1)[0]
    top, folder = (path.split("/") + [""])[:2]
    return top == TESTS.name and folder in SLOW_FOLDERS and path not in BESIDE_RUNS
