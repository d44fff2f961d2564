"""``deploy/``'s KubeRay manifest holds what docs/multinode.md promises of it: the Ray version that
pyproject.toml pins, every pod mounting the shared run volume and an in-memory ``/dev/shm``, every
volume a pod mounts declared in its pod, and one image for every pod (the same code on every node);
and it is a valid KubeRay ``RayCluster`` by a schema of KubeRay's API (``raycluster_schema.py``; no
cluster is needed, and none is run). Its scripts that change directory land on the repository root,
and ``tests/gpu`` collects under a pytest without xdist, as on the GPU image (deploy/gpu/gpu_check.sh)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.unit.raycluster_schema import RAYCLUSTER

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "kuberay" / "raycluster.yaml"


def pods(cluster: dict) -> list[dict]:
    """The pod specs of the head group and of every worker group."""
    spec = cluster["spec"]
    return [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]


def test_the_raycluster_runs_the_pinned_ray_with_the_shared_volume_and_shm_on_every_pod() -> None:
    cluster = yaml.safe_load(MANIFEST.read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    pin = re.search(r'"ray\[default\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin is not None and cluster["spec"]["rayVersion"] == pin[1]
    images = set()
    for pod in pods(cluster):
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            images.add(container["image"])
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert set(mounts.values()) <= set(volumes), mounts  # every mount is declared in its pod
            assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
            assert "persistentVolumeClaim" in volumes[mounts["/shared/runs"]]
    assert len(images) == 1
    for group in cluster["spec"]["workerGroupSpecs"]:  # KubeRay reads every rayStartParams value as a string
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
    assert all(isinstance(v, str) for v in cluster["spec"]["headGroupSpec"]["rayStartParams"].values())


def test_the_raycluster_is_valid_by_kuberays_schema() -> None:
    jsonschema.validate(yaml.safe_load(MANIFEST.read_text()), RAYCLUSTER)


def _set(cluster: dict, path: str, value: object) -> dict:
    *parents, last = path.split(".")
    node = cluster
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return cluster


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        ("spec.workerGroupSpec", [], "Additional properties are not allowed ('workerGroupSpec'"),  # a misspelt key
        ("spec.headGroupSpec.rayStartParams.num-gpus", 8, "8 is not of type 'string'"),
        ("spec.workerGroupSpecs.0.groupName", "", "should be non-empty"),
        ("spec.workerGroupSpecs.0.replicas", -1, "-1 is less than the minimum of 0"),
        ("apiVersion", "ray.io/v1alpha1", "'ray.io/v1' was expected"),
    ],
)
def test_the_schema_refuses_what_kuberay_would(path: str, value: object, says: str) -> None:
    """The check can fail: each of these edits of the manifest is refused, with KubeRay's reason."""
    broken = _set(yaml.safe_load(MANIFEST.read_text()), path, value)
    with pytest.raises(jsonschema.ValidationError, match=re.escape(says)):
        jsonschema.validate(broken, RAYCLUSTER)


@pytest.mark.parametrize("script", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "deploy").rglob("*.sh")))
def test_a_script_that_changes_to_a_folder_of_its_own_lands_on_the_repository_root(script: str) -> None:
    """Those that ``cd "$(dirname "$0")/…"`` run ``.venv``, ``tests`` and ``bench`` from there (the
    GPU scripts ran from ``deploy/`` after they moved into ``deploy/gpu/``)."""
    for rel in re.findall(r'^cd "\$\(dirname "\$0"\)/([./]+)"', (ROOT / script).read_text(), re.M):
        assert ((ROOT / script).parent / rel).resolve() == ROOT, rel


@pytest.mark.slow  # a pytest of its own, importing torch: 10 s
def test_the_gpu_tests_collect_without_xdist() -> None:
    """The GPU image's pytest has no xdist: a hook only xdist knows would stop it at collection."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "tests/gpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^\d+ tests? collected", done.stdout, re.M), done.stdout[-2000:]
