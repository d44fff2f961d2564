"""A run's own id: what names the resources a run holds on a machine (its ``/dev/shm`` weight slots).

``run.name`` names a run's Redis keys, but two runs of one name can live at once on one machine
(each with its embedded Redis in its own ``run.dir``), and a starting learner replaces the slot
files of its name: the two runs' slots were one. So a run's machine resources are named by its id,
a random hex string the driver draws at the first start of a run directory and keeps in it
(``<run.dir>/.rredcot-id``): a resume (or ``run.resume=never`` in the same directory) keeps the id,
so a restarted learner still replaces the slots its killed predecessor left, and a run in another
directory never touches them. The driver publishes the id under the run's Redis prefix for its
workers (a learner rank 0 on a node without ``run.dir``); a stage started alone (``rredcot learn``)
draws one there if no driver did.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import redis

from rredcot.common.streams import key, run_key

UID_FILE = ".rredcot-id"
UID = re.compile(r"[0-9a-f]{12}")


def new_uid() -> str:
    return uuid.uuid4().hex[:12]


def dir_uid(run_dir: Path) -> str:
    """The id of the run in ``run_dir``: the one kept there, or a new one, kept there from now on."""
    path = run_dir / UID_FILE
    if path.is_file() and UID.fullmatch(found := path.read_text().strip()):
        return found
    uid = new_uid()
    tmp = path.with_name(f"{UID_FILE}.{os.getpid()}")
    tmp.write_text(uid + "\n")
    os.replace(tmp, path)
    return uid


def uid_key(run_id: str) -> str:
    return key(run_id, "uid")


def publish_uid(client: redis.Redis, run_id: str, uid: str) -> None:
    """The driver: the run's id, for its workers."""
    client.set(run_key(client, run_id, "uid"), uid)


def run_uid(client: redis.Redis, run_id: str) -> str:
    """The id of run ``run_id`` as its driver published it; a stage started without a driver draws
    one (the first to ask sets it, the others read it)."""
    found = client.get(uid_key(run_id))
    if found is None:
        client.set(run_key(client, run_id, "uid"), new_uid(), nx=True)
        found = client.get(uid_key(run_id))
    return found.decode()
