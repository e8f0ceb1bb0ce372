"""Constants shared by the helm_cluster fixtures and tests (a module of its own: conftest is not importable)."""

from __future__ import annotations

from tests.support.paths import REPO_ROOT

CHART = REPO_ROOT / "deploy" / "helm" / "vllm-lookahead"
GPU_PRODUCT = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
FULL_NODE_TAINT = {"key": "vllm-lookahead.test/full-node", "value": "true", "effect": "NoSchedule"}

PREREQUISITES = [
    {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
     "handler": "nvidia"},
    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
     "metadata": {"name": "inference-high"}, "value": 1000000},
    {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "model-cache-rwx"},
     "spec": {"capacity": {"storage": "200Gi"}, "accessModes": ["ReadWriteMany"],
              "storageClassName": "fast-ssd", "persistentVolumeReclaimPolicy": "Retain",
              "nfs": {"server": "nfs.example.internal", "path": "/models"}}},
]
