"""The nodes a Ray cluster's GCS holds alive: a JSON line ``{node id: address}`` for each line read
on stdin, from Ray's own GCS client. One process answers every question of a harness: ``ray status``
is a Python process that imports Ray for each (2 CPU-s on these machines; 30 CPU-s of the namespace
cluster's 150 went to it).

Usage: python tests/cluster/gcs_nodes.py HEAD_IP:PORT (``RAY_AUTH_MODE=token`` and the cluster's
token as ``ray status`` wants them).
"""

from __future__ import annotations

import json
import sys

from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import GcsNodeInfo


def main(address: str) -> None:
    client = GcsClient(address=address)
    for _ in sys.stdin:
        nodes = client.get_all_node_info(timeout=30).values()
        alive = {n.node_id.hex(): n.node_manager_address for n in nodes if n.state == GcsNodeInfo.ALIVE}
        print(json.dumps(alive), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
