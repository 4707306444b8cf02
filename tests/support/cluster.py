"""The local Kubernetes cluster for integration tests, as pytest fixtures.

``kube_cluster`` (session scope) builds the control-plane binaries if needed,
starts a private cluster (real etcd, kube-apiserver, kube-controller-manager
and kube-scheduler, kwok-simulated GPU nodes) and deletes it when the session
ends.  All the work is done by ``e2e/cluster/cluster.sh``, the same script that
``make cluster-up`` runs; this module only calls it.

With ``LLMOP_TEST_KUBECONFIG=<path>`` or ``USE_EXISTING_CLUSTER=1`` (then
``$KUBECONFIG`` or ``~/.kube/config``) the fixture uses that cluster instead and
tears nothing down, so the same tests run on kind or a real cluster.

``namespace`` (function scope) gives each test a fresh ``test-<random>``
namespace.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import functools
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO_ROOT / "e2e" / "cluster" / "cluster.sh"
BUILD_SH = REPO_ROOT / "e2e" / "cluster" / "build.sh"
# The LeaderWorkerSet controller every cluster runs (e2e/lws/lws.sh), built like the rest.
BUILD_LWS_SH = REPO_ROOT / "e2e" / "cluster" / "build-lws.sh"

# Generous: a cold start includes building the binaries (tens of minutes on 2 cores).
_UP_TIMEOUT_S = 90 * 60

# node.sh's own lock serialises one `up` or `down`; this one is held by a test or bench process
# for its cluster's whole life, so a second session waits for the machine's one real node instead
# of failing on it. flock dies with the process, so a killed session never leaves it taken.
_REAL_NODE_TENANCY = pathlib.Path("/run/llmop-node.tenancy")
_REAL_NODE_OWNER = pathlib.Path("/run/llmop-node/owner")
_REAL_NODE_WAIT_S = float(os.environ.get("LLMOP_REAL_NODE_WAIT_S", str(60 * 60)))
_tenancies: dict[str, int] = {}
_KUBECTL_TIMEOUT_S = 120

T = TypeVar("T")


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call; unlike its base class, the message includes stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {self.stderr}"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A running cluster: where its kubeconfig is and how to reach it."""

    kubeconfig: pathlib.Path
    # Directory of the locally built binaries; None for an existing cluster,
    # where kubectl comes from PATH.
    bin_dir: pathlib.Path | None
    # kwokctl cluster name when this session owns the cluster, else None.
    name: str | None = None

    @property
    def kubectl_path(self) -> str:
        """The kubectl binary: the one built with the cluster, else the one on PATH."""
        if self.bin_dir is not None:
            return str(self.bin_dir / "kubectl")
        return _fallback_kubectl()

    def env(self) -> dict[str, str]:
        """Environment for child processes (kopf, llmop run) that should talk to this cluster."""
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        if self.bin_dir is not None:
            env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl --kubeconfig <this cluster> *args``, capturing text output."""
        cmd = [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=_KUBECTL_TIMEOUT_S,
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, cmd, result.stdout, result.stderr)
        return result

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this cluster (the library is untyped)."""
        # Imported here so that kubectl-only users never pay for the client import.
        from kubernetes import config

        return config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )


@functools.cache
def _fallback_kubectl() -> str:
    # For an existing cluster: prefer our own build when it is there (known
    # version, current skew), else whatever kubectl the machine has.
    built = subprocess.run(
        [str(BUILD_SH), "--print-dir"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if built and (pathlib.Path(built) / ".complete").exists():
        return str(pathlib.Path(built) / "kubectl")
    found = shutil.which("kubectl")
    if found is None:
        raise RuntimeError("kubectl is not on PATH (needed for an existing cluster)")
    return found


def _run_script(
    action: str,
    name: str,
    state_dir: pathlib.Path | None,
    owner_pid: int | None,
    *,
    real_node: str = "off",
    metrics: str = "auto",
) -> str:
    # LLMOP_PYTHON: the metrics pipeline (started with the real node) renders its config from
    # the chart with this interpreter's helm SDK.
    env = dict(
        os.environ,
        LLMOP_CLUSTER_NAME=name,
        LLMOP_REAL_NODE=real_node,
        LLMOP_METRICS=metrics,
        LLMOP_PYTHON=sys.executable,
    )
    if state_dir is not None:
        env["LLMOP_CLUSTER_STATE"] = str(state_dir)
    if owner_pid is not None:
        env["LLMOP_CLUSTER_OWNER_PID"] = str(owner_pid)
    else:
        env.pop("LLMOP_CLUSTER_OWNER_PID", None)
    # stderr is inherited, not captured: build and startup progress must stay
    # visible (pytest -s, CI logs) rather than vanish until the end.
    result = subprocess.run(
        [str(CLUSTER_SH), action],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
        timeout=_UP_TIMEOUT_S,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{CLUSTER_SH.name} {action} failed for cluster {name!r}")
    return result.stdout


def start_cluster(
    name: str,
    *,
    state_dir: pathlib.Path | None = None,
    owner_pid: int | None = None,
    real_node: str = "off",
    metrics: str = "auto",
) -> Cluster:
    """Build the binaries if needed and start (or reuse) the cluster ``name``.

    With ``owner_pid`` the cluster deletes itself once that process exits, even
    if it is killed before any Python clean-up can run. ``real_node`` is
    cluster.sh's LLMOP_REAL_NODE: "off" (kwok nodes only, the default for the
    integration tests, so their pods never run for real), "auto" or "on".
    ``metrics`` is its LLMOP_METRICS: "off" leaves the pipeline to
    :func:`start_metrics_pipeline`.
    """
    if real_node == "on":
        _take_real_node(name)
    try:
        out = _run_script("up", name, state_dir, owner_pid, real_node=real_node, metrics=metrics)
    except BaseException:
        _give_back_real_node(name)
        raise
    kubeconfig = pathlib.Path(out.strip().splitlines()[-1])
    bin_dir = pathlib.Path((kubeconfig.parent / "bin-dir").read_text().strip())
    return Cluster(kubeconfig=kubeconfig, bin_dir=bin_dir, name=name)


def start_metrics_pipeline(cluster: Cluster) -> None:
    """Start the metrics pipeline on a running cluster whose real node is joined (cluster.sh
    metrics; a no-op when it runs). cluster.sh keeps each cluster's state in
    <state dir>/<name>/, beside its kubeconfig."""
    if cluster.name is None:
        raise RuntimeError("the metrics pipeline starts only on a cluster this session owns")
    _run_script("metrics", cluster.name, cluster.kubeconfig.parent.parent, None)


def stop_cluster(name: str, *, state_dir: pathlib.Path | None = None) -> None:
    """Delete the cluster ``name`` and its state; a no-op when it is not running."""
    try:
        _run_script("down", name, state_dir, None)
    finally:
        _give_back_real_node(name)


def _take_real_node(name: str) -> None:
    """Wait (up to LLMOP_REAL_NODE_WAIT_S) until no other session of this machine holds the node."""
    fd = os.open(_REAL_NODE_TENANCY, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + _REAL_NODE_WAIT_S
    next_note = 0.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            now = time.monotonic()
            if now > deadline:
                os.close(fd)
                raise TimeoutError(
                    f"the real node stayed taken for {_REAL_NODE_WAIT_S:.0f}s (held by "
                    f"{_real_node_owner()!r}); raise LLMOP_REAL_NODE_WAIT_S or stop that run"
                ) from None
            if now >= next_note:
                print(
                    f"{name}: waiting for the real node (held by {_real_node_owner()!r})",
                    file=sys.stderr,
                )
                next_note = now + 60
            time.sleep(2)
            continue
        _tenancies[name] = fd
        return


def _give_back_real_node(name: str) -> None:
    fd = _tenancies.pop(name, None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor releases the flock


def _real_node_owner() -> str:
    try:
        return _REAL_NODE_OWNER.read_text().strip()
    except OSError:
        return "unknown"


def existing_cluster() -> Cluster | None:
    """The cluster named by LLMOP_TEST_KUBECONFIG / USE_EXISTING_CLUSTER=1, if any."""
    explicit = os.environ.get("LLMOP_TEST_KUBECONFIG")
    if explicit:
        return Cluster(kubeconfig=pathlib.Path(explicit).expanduser(), bin_dir=None)
    if os.environ.get("USE_EXISTING_CLUSTER", "").lower() in {"1", "true", "yes"}:
        kubeconfig = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        path = pathlib.Path(kubeconfig or "~/.kube/config").expanduser()
        return Cluster(kubeconfig=path, bin_dir=None)
    return None


def wait_until(
    probe: Callable[[], T | None], *, timeout: float = 60, interval: float = 0.5, what: str = ""
) -> T:
    """Poll ``probe`` until it returns something other than None/False; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or probe!r}")
        time.sleep(interval)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the binaries before the first test when cluster tests were collected.

    A cold build takes longer than pytest-timeout allows one test (and so its
    fixtures' setup); done here, it runs before any test timer starts, and in
    the open rather than inside captured output.
    """
    if session.config.option.collectonly or existing_cluster() is not None:
        return
    if not any(item.get_closest_marker("cluster") for item in session.items):
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    uncaptured = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with uncaptured:
        for script in (BUILD_SH, BUILD_LWS_SH):
            result = subprocess.run([str(script)], stdout=subprocess.DEVNULL, check=False)
            if result.returncode != 0:
                raise pytest.UsageError(f"{script} failed (exit {result.returncode})")


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[Cluster]:
    """The cluster for this test session: an existing one, or a private local one."""
    existing = existing_cluster()
    if existing is not None:
        existing.kubectl("get", "--raw", "/readyz")
        yield existing
        return

    name = f"llmop-test-{os.getpid()}-{secrets.token_hex(3)}"

    def stop() -> None:
        try:
            stop_cluster(name)
        except Exception as exc:  # clean-up must not mask the test result
            print(f"warning: stopping cluster {name}: {exc}", file=sys.stderr)

    # atexit covers a session that dies in Python (KeyboardInterrupt, internal
    # error); the owner-pid watchdog started by cluster.sh covers SIGKILL.
    atexit.register(stop)
    try:
        yield start_cluster(name, owner_pid=os.getpid())
    finally:
        stop()
        atexit.unregister(stop)


def create_namespace(cluster: Cluster, prefix: str) -> str:
    """A fresh namespace ``<prefix>-<random>``, ready for pods: the controller-manager has
    created its default ServiceAccount (pods are rejected until then)."""
    name = f"{prefix}-{secrets.token_hex(4)}"
    cluster.kubectl("create", "namespace", name)
    wait_until(
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        timeout=30,
        what=f"default ServiceAccount in {name}",
    )
    return name


@pytest.fixture
def namespace(kube_cluster: Cluster) -> Iterator[str]:
    """A fresh namespace ``test-<random>``, deleted (without waiting) afterwards."""
    name = create_namespace(kube_cluster, "test")
    try:
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def apply_crd(cluster: Cluster, path: pathlib.Path, name: str, timeout: float = 60) -> None:
    """Apply the CRD in `path` (server-side) and wait until `name` (`plural.group`) is
    Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    established = '{.status.conditions[?(@.type=="Established")].status}'
    wait_until(
        lambda: (
            cluster.kubectl(
                "get", f"crd/{name}", "-o", f"jsonpath={established}", check=False
            ).stdout.strip()
            == "True"
        ),
        timeout=timeout,
        what=f"crd/{name} Established",
    )
