"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager, scheduler, kwok.

Used by the helm_cluster test tier.  The binaries come from scripts/setup_k8s.sh (built from the Go
module proxy, etcd from Debian).  Everything the API server and the scheduler decide is real:
admission (PodSecurity, PriorityClass, RuntimeClass, ServiceAccount), strict field validation, CRD
schemas, Deployment rollouts, PDBs, scheduling on taints/tolerations/resources/affinity, PV binding.
kwok stands in for kubelets: it heartbeats fake Nodes and marks scheduled pods Running/Ready, and Job
pods (and `helm test` hook pods, see HELM_TEST_STAGE) Succeeded.  Containers, images, probes and
volumes are not exercised.

    with K8sCluster() as cluster:
        cluster.add_node("gpu-0", cpu="64", memory="512Gi", gpus=8, taints=[GPU_TAINT])
        cluster.kubectl("get", "nodes")
        subprocess.run(["helm", "install", ...], env=cluster.env)

Stop order matters: the API server goes before etcd (the other order hangs the API server).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

from .paths import cache_dir, versions
from .process import Service, free_port, log_tail, spawn, stop_process_group

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

# kwok's stock stages complete only Job pods.  `helm test` waits for its hook pod to succeed, so this
# extra stage does for pods annotated helm.sh/hook=test what kwok's pod-complete does for Job pods:
# once Running, the containers terminate with exit code 0.  (The hook's HTTP checks do not run.)
HELM_TEST_STAGE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete-helm-test
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.annotations["helm.sh/hook"]'
      operator: 'In'
      values: ['test']
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""


def k8s_dir() -> Path:
    """Where scripts/setup_k8s.sh put the binaries, kwok stages and CRDs; an error with the fix if not."""
    path = cache_dir() / f"k8s-{versions()['K8S_VERSION']}"
    needed = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "etcd"]
    missing = [n for n in needed if not (path / "bin" / n).exists()]
    if missing or not (path / "kwok-stages.yaml").exists() or not (path / "crds").is_dir():
        raise FileNotFoundError(
            f"Kubernetes control plane missing in {path} ({missing or 'stages/CRDs'}): "
            "run `scripts/setup.sh k8s` (first build ~10-20 min on 2 cores)"
        )
    return path


class K8sCluster(Service):
    """One throwaway cluster in a temp dir; ``start()`` returns when nodes can be added."""

    def __init__(self, workdir: Path | None = None):
        self.home = k8s_dir()
        self.bin = self.home / "bin"
        super().__init__(workdir, "k8s-")
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.api_port = free_port()
        self.token = secrets.token_hex(16)
        self.kubeconfig = self.workdir / "kubeconfig"
        self.procs: dict[str, subprocess.Popen] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm subprocesses: only this cluster's kubeconfig."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["HELM_CACHE_HOME"] = str(self.workdir / "helm" / "cache")
        env["HELM_CONFIG_HOME"] = str(self.workdir / "helm" / "config")
        env["HELM_DATA_HOME"] = str(self.workdir / "helm" / "data")
        return env

    def start(self, timeout: float = 120.0) -> K8sCluster:
        try:
            self._write_files()
            self._spawn("etcd", [
                str(self.bin / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{self.etcd_peer_port}",
                "--log-level=warn",
            ])
            pki = self.workdir / "pki"
            self._spawn("kube-apiserver", [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={pki}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                # Loopback is refused as the advertised address unless nothing reconciles endpoints.
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                # Streaming watch-lists need etcd progress notifications, which Debian's etcd 3.4.23
                # lacks: every watch of the controllers, scheduler and kwok then fails ("RequestWatchProgress
                # is disabled") and they relist on a backoff, reacting in seconds, not milliseconds.
                # Serve plain list+watch.
                "--feature-gates=WatchList=false",
            ])
            self._wait_api(timeout)
            common = [
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--profiling=false",
            ]
            self._spawn("kube-controller-manager", [
                str(self.bin / "kube-controller-manager"), *common,
                f"--secure-port={free_port()}",
                # nodeipam needs a cluster CIDR; node lifecycle stays on (it lifts the not-ready taint).
                "--controllers=*,-nodeipam",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'apiserver.crt'}",
                "--use-service-account-credentials=false",
            ])
            self._spawn("kube-scheduler", [
                str(self.bin / "kube-scheduler"), *common, f"--secure-port={free_port()}",
            ])
            self._spawn("kwok", [
                str(self.bin / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                f"--config={self.workdir / 'kwok-stages.yaml'}",
                "--cidr=10.244.0.1/16",
                "--node-ip=10.0.0.1",
                f"--server-address=127.0.0.1:{free_port()}",
            ])
            self._wait_for(lambda: self._get_ok("serviceaccount", "default", "-n", "default"),
                           timeout, "the default ServiceAccount (controller-manager running)")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """kwok, scheduler, controller-manager, then the API server, and etcd last."""
        for name in ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop_process_group(proc, 15)

    # -- kubectl -------------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.bin / "kubectl"), *args], input=input, capture_output=True,
                              text=True, env=self.env, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, manifest: dict[str, Any] | str, *extra: str) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "--server-side", "--force-conflicts", *extra, "-f", "-", input=text)

    def add_node(self, name: str, *, cpu: str, memory: str, gpus: int = 0,
                 taints: list[dict[str, str]] | None = None,
                 labels: dict[str, str] | None = None, wait: bool = True, timeout: float = 90) -> None:
        """A fake Node kwok manages (status.allocatable as given); waits until it is Ready unless told not
        to (then call ``wait_nodes_ready`` once for several nodes)."""
        resources = {"cpu": cpu, "memory": memory, "pods": "110"}
        if gpus:
            resources["nvidia.com/gpu"] = str(gpus)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok", **(labels or {})},
            },
            "spec": {"taints": taints or []},
            # Node create keeps status: kwok's node-initialize stage keeps these numbers.
            "status": {"allocatable": resources, "capacity": resources},
        }
        self.kubectl("create", "-f", "-", input=json.dumps(node))
        if wait:
            self.wait_nodes_ready(timeout)

    def wait_nodes_ready(self, timeout: float = 90) -> None:
        self.kubectl("wait", "--for=condition=Ready", "node", "--all", f"--timeout={int(timeout)}s",
                     timeout=timeout + 10)

    def install_crds(self, timeout: float = 60) -> list[str]:
        """The prometheus-operator and KEDA CRDs cached by setup; returns their names once Established."""
        files = sorted((self.home / "crds").glob("*.yaml"))
        args: list[str] = []
        for f in files:
            args += ["-f", str(f)]
        # Server-side apply: the Prometheus CRDs are too large for the last-applied annotation.
        self.kubectl("apply", "--server-side", *args, timeout=timeout)
        names = [n.removeprefix("customresourcedefinition.apiextensions.k8s.io/") for n in
                 self.kubectl("get", "crd", "-o", "name").stdout.split()]
        self.kubectl("wait", "--for=condition=Established", *[f"crd/{n}" for n in names],
                     f"--timeout={int(timeout)}s", timeout=timeout + 10)
        return names

    # -- internals -----------------------------------------------------------------------------

    def _write_files(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"],
                       check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout",
                        "-out", str(pki / "sa.pub")], check=True, capture_output=True)
        # One static admin token (system:masters): the tests act as a cluster admin installing a chart.
        (self.workdir / "tokens.csv").write_text(f'{self.token},admin,admin,"system:masters"\n')
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kwok", "cluster": {
                "server": self.server, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "kwok", "context": {"cluster": "kwok", "user": "admin"}}],
            "current-context": "kwok",
        }))
        stages = (self.home / "kwok-stages.yaml").read_text()
        (self.workdir / "kwok-stages.yaml").write_text(stages + "\n---\n" + HELM_TEST_STAGE)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        self.procs[name] = spawn(cmd, self.workdir / f"{name}.log")

    def log_tail(self, name: str, lines: int = 30) -> str:
        return log_tail(self.workdir / f"{name}.log", lines)

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def _get_ok(self, *args: str) -> bool:
        return self.kubectl("get", *args, check=False, timeout=30).returncode == 0

    def _wait_api(self, timeout: float) -> None:
        self._wait_for(
            lambda: self.kubectl("get", "--raw", "/readyz", check=False, timeout=30).stdout.strip() == "ok",
            timeout, "kube-apiserver /readyz")

    def _wait_for(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if ready():
                    return
            except subprocess.TimeoutExpired:  # a starved machine: a slow probe is a "not yet"
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{what} not ready after {timeout:.0f} s; logs in {self.workdir}")
