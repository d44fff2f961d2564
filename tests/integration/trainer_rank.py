"""One learner rank, a real ``Trainer``, for the two-rank resume test.

Usage: python -m tests.integration.trainer_rank '<json spec>', from the repository root (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``RREDCOT_RENDEZVOUS`` come from the environment, as the driver
gives them). Spec keys: overrides (of the ``tests`` config); die_at (a step): this rank trains that
step's share, its all-reduce included, then dies (exit 3) before recording it. Prints the rank's
step and counters as one JSON line at the end.
"""

from __future__ import annotations

import json
import os
import sys

from rredcot.common.startup_gc import collector_off

with collector_off():  # a rank's imports, as a learner worker's (launch.stages.StageWorker)
    from rredcot.common.config import load_config
    from rredcot.learner.trainer import Trainer

DIED = 3


def main(spec: dict) -> None:
    rank = int(os.environ["RANK"])
    with collector_off():
        trainer = Trainer(load_config("tests", spec["overrides"]), name=f"learner{rank}", rank=rank)
    die_at = spec.get("die_at")
    if die_at is not None:
        while trainer.step + 1 < die_at:
            trainer.train_on(trainer.next_batch())
        trainer.engine.train_step(trainer.next_batch().samples)
        os._exit(DIED)  # the step's update happened on every rank; this rank's record of it did not
    trainer.run()
    print(json.dumps({"step": trainer.step, "samples": trainer.engine.counters["samples"]}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
