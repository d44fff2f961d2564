"""A JSON Schema of KubeRay's ``RayCluster`` (``ray.io/v1``), written here from KubeRay's API reference
(its RayClusterSpec, HeadGroupSpec and WorkerGroupSpec field tables) for the parts a manifest of this
project uses: every KubeRay field name is listed, so a misspelt or removed key fails, with its type;
the pod template keeps to the few Kubernetes fields the manifest sets (a container's name, image,
resources and volume mounts; a volume's claim or in-memory directory) and lets the rest through."""

from __future__ import annotations

from typing import Any

STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
# a Kubernetes quantity: 8, "1000Gi", "500m", "1.5"
QUANTITY = {
    "anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[+-]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE])?$"}]
}
RESOURCES = {
    "type": "object",
    "properties": {k: {"type": "object", "additionalProperties": QUANTITY} for k in ("limits", "requests")},
}
CONTAINER = {
    "type": "object",
    "required": ["name", "image"],
    "properties": {
        "name": {"type": "string"},
        "image": {"type": "string"},
        "resources": RESOURCES,
        "volumeMounts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "mountPath"],
                "properties": {"name": {"type": "string"}, "mountPath": {"type": "string", "pattern": "^/"}},
            },
        },
    },
}
VOLUME = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "persistentVolumeClaim": {
            "type": "object",
            "required": ["claimName"],
            "properties": {"claimName": {"type": "string"}, "readOnly": {"type": "boolean"}},
            "additionalProperties": False,
        },
        "emptyDir": {
            "type": "object",
            "properties": {"medium": {"enum": ["", "Memory"]}, "sizeLimit": QUANTITY},
            "additionalProperties": False,
        },
    },
}
POD_TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["containers"],
            "properties": {
                "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
                "volumes": {"type": "array", "items": VOLUME},
            },
        },
    },
}
HEAD_GROUP = {
    "type": "object",
    "required": ["template"],
    "properties": {
        "template": POD_TEMPLATE,
        "headService": {"type": "object"},
        "enableIngress": {"type": "boolean"},
        "rayStartParams": STRING_MAP,
        "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
    },
    "additionalProperties": False,
}
WORKER_GROUP = {
    "type": "object",
    "required": ["groupName", "template"],
    "properties": {
        "suspend": {"type": "boolean"},
        "groupName": {"type": "string", "minLength": 1},
        "replicas": {"type": "integer", "minimum": 0},
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "idleTimeoutSeconds": {"type": "integer"},
        "rayStartParams": STRING_MAP,
        "template": POD_TEMPLATE,
        "scaleStrategy": {"type": "object", "properties": {"workersToDelete": {"type": "array"}}},
        "numOfHosts": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}
RAYCLUSTER: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["headGroupSpec"],
            "properties": {
                "suspend": {"type": "boolean"},
                "managedBy": {"enum": ["ray.io/kuberay-operator", "kueue.x-k8s.io/multikueue"]},
                "autoscalerOptions": {"type": "object"},
                "headServiceAnnotations": STRING_MAP,
                "enableInTreeAutoscaling": {"type": "boolean"},
                "gcsFaultToleranceOptions": {"type": "object"},
                "headGroupSpec": HEAD_GROUP,
                "rayVersion": {"type": "string"},
                "workerGroupSpecs": {"type": "array", "items": WORKER_GROUP},
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}
