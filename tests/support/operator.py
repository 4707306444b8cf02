"""The real `llmop run` process and a small kit for reading the cluster, shared by the
integration tests (kwok nodes) and the e2e tests (the real node)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from llmop.kube import Kube
from support.cluster import Cluster, wait_until
from support.manifests import llmd_manifest

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = REPO_ROOT / "crds" / "serving.llmop.dev_llmdeployments.yaml"
CRD_NAME = "llmdeployments.serving.llmop.dev"
RBAC_FILE = REPO_ROOT / "deploy" / "rbac.yaml"
OPERATOR_NAMESPACE = "llmop-system"
OPERATOR_SERVICE_ACCOUNT = "llmop"
API_VERSION = "serving.llmop.dev/v1alpha1"
TEST_MANAGER = "llmop-tests"
LOG_TAIL_LINES = 150


def llmop_executable() -> list[str]:
    """The installed `llmop` console script of this virtualenv."""
    script = Path(sys.executable).with_name("llmop")
    if script.exists():
        return [str(script)]
    found = shutil.which("llmop")
    return [found] if found else [sys.executable, "-m", "llmop.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Conditions of an object by type."""
    if obj is None:
        return {}
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


class OperatorProcess:
    """`llmop run` as a subprocess with its own liveness/metrics ports and a log file."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        extra_env: dict[str, str] | None = None,
        *,
        namespace: str = OPERATOR_NAMESPACE,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.namespace = namespace
        """The namespace the process runs "in" (POD_NAMESPACE): where its leader Lease lives."""
        self.extra_env = dict(extra_env or {})
        self.liveness_port = free_port()
        self.metrics_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90) -> None:
        # Settings through LLMOP_* variables: the same config path the Helm chart uses.
        env = dict(
            os.environ,
            KUBECONFIG=str(self.kubeconfig),
            LLMOP_LIVENESS_PORT=str(self.liveness_port),
            LLMOP_METRICS_PORT=str(self.metrics_port),
            LLMOP_BIND_ADDRESS="127.0.0.1",
            LLMOP_LOG_FORMAT="text",
            LLMOP_RETRY_DELAY_SECONDS="2",
            POD_NAMESPACE=self.namespace,
            **self.extra_env,
        )
        command = [*llmop_executable(), "run"]
        with self.log_path.open("ab") as log:
            log.write(f"--- start: {' '.join(command)}\n".encode())
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT
            )
        wait_until(self._healthy, timeout=timeout, interval=0.5, what="operator /healthz")

    def _healthy(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"operator exited early:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=5
            ) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 20) -> int | None:
        if self.process is None:
            return None
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def metrics(self) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as response:
            text: str = response.read().decode()
            return text

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, label_text = head.partition("{")
            if metric != name:
                continue
            if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                total += float(value)
        return total

    def rss_bytes(self) -> int:
        if self.process is None:
            return 0
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class Kit:
    """Reads and writes the cluster through llmop's own gateway (fast, plain dicts)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kube = Kube.connect(kubeconfig=cluster.kubeconfig)

    def apply_llmd(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Create or update a CR the way `kubectl apply --server-side` would."""
        return self.kube.apply(llmd_manifest(namespace, name, spec), field_manager=TEST_MANAGER)

    def get_llmd(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.read(API_VERSION, "LLMDeployment", namespace, name)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.read(api_version, kind, namespace, name)

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.read("apps/v1", "Deployment", namespace, name)

    def wait_condition(
        self, namespace: str, name: str, type_: str, status: str, *, timeout: float = 60
    ) -> dict[str, Any]:
        """Wait until condition `type_` has `status` for the current generation."""

        def probe() -> dict[str, Any] | None:
            obj = self.get_llmd(namespace, name)
            if obj is None:
                return None
            found = conditions(obj).get(type_)
            current = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"].get(
                "generation"
            )
            if found is not None and found["status"] == status and current:
                return obj
            return None

        return wait_until(
            probe, timeout=timeout, interval=0.3, what=f"{namespace}/{name} {type_}={status}"
        )


def install_crd(cluster: Cluster) -> None:
    """The LLMDeployment CRD, installed from crds/ and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    # Polled, not `kubectl wait`: right after the apply the CRD can have no status.conditions
    # yet, and kubectl wait then fails at once ("accessor error: <nil>").
    established = '{.status.conditions[?(@.type=="Established")].status}'
    wait_until(
        lambda: (
            cluster.kubectl(
                "get", f"crd/{CRD_NAME}", "-o", f"jsonpath={established}", check=False
            ).stdout.strip()
            == "True"
        ),
        timeout=60,
        what=f"crd/{CRD_NAME} Established",
    )


def operator_kubeconfig_for(cluster: Cluster, directory: Path) -> Path:
    """A kubeconfig that authenticates as the operator's ServiceAccount from deploy/rbac.yaml."""
    cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(RBAC_FILE))
    return token_kubeconfig(cluster, OPERATOR_SERVICE_ACCOUNT, directory / "kubeconfig")


def token_kubeconfig(
    cluster: Cluster, service_account: str, path: Path, duration: str = "4h"
) -> Path:
    """Write to `path` the cluster's kubeconfig authenticating as `service_account` (in the
    operator's namespace) with a fresh token; returns `path`."""
    token = cluster.kubectl(
        "create", "token", service_account, "-n", OPERATOR_NAMESPACE, f"--duration={duration}"
    ).stdout.strip()
    config = json.loads(
        cluster.kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "json").stdout
    )
    config["users"][0]["user"] = {"token": token}
    path.write_text(json.dumps(config))
    return path
