"""A real control plane for the chart, once per session (tests/helm_cluster).

Nodes: two 8-GPU nodes (tainted nvidia.com/gpu, labelled with the GPU product the everything-on values
select), one CPU node for the sidecar and the CPU-only server, and one "full" 2-GPU node with a taint
of its own for the rollout test.  Cluster-wide objects the ci/ values assume an operator made first: the
prometheus-operator and KEDA CRDs, RuntimeClass "nvidia", PriorityClass "inference-high" and a
ReadWriteMany PersistentVolume of class "fast-ssd" (static provisioning; no CSI driver runs here).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helm_cluster_support import FULL_NODE_TAINT, GPU_PRODUCT, PREREQUISITES

from tests.support.k8s_cluster import GPU_TAINT, K8sCluster
from tests.support.paths import tool


@pytest.fixture(scope="session")
def k8s() -> Iterator[K8sCluster]:
    cluster = K8sCluster().start()
    try:
        for i in range(2):
            cluster.add_node(f"kwok-gpu-{i}", cpu="64", memory="1Ti", gpus=8, taints=[GPU_TAINT],
                             labels=GPU_PRODUCT, wait=False)
        cluster.add_node("kwok-cpu-0", cpu="16", memory="64Gi", wait=False)
        cluster.add_node("kwok-gpu-full", cpu="32", memory="512Gi", gpus=2, wait=False,
                         taints=[GPU_TAINT, FULL_NODE_TAINT], labels={"vllm-lookahead.test/pool": "full"})
        cluster.crds = cluster.install_crds()  # type: ignore[attr-defined]
        cluster.wait_nodes_ready(timeout=120)
        for obj in PREREQUISITES:
            cluster.apply(obj)
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def helm(k8s: K8sCluster) -> Callable[..., subprocess.CompletedProcess[str]]:
    """helm(*args) against the session cluster; returns the CompletedProcess (callers assert)."""
    binary: Path = tool("helm")

    def _helm(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(binary), *args], capture_output=True, text=True, env=k8s.env,
                              timeout=timeout, check=False)

    return _helm
