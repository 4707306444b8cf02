"""LoRA adapters on the real node (simulator engine, which speaks vLLM 0.32's runtime LoRA API):
adding an adapter to a running 2-replica LLMDeployment makes both replicas serve it with no pod
restarted (the agents follow the mounted ConfigMap, which the kubelet refreshes at once because
the operator writes the new set's revision on each pod: 1.0 s measured, against 86 s on the
kubelet's periodic sync alone); removing it unloads it from both; a new replica is Ready only with
every adapter loaded; status.adapters counts the replicas serving each.

The adapters' files sit on the model's own claim (a static hostPath volume, as for the real-vLLM
tests): `pvc://` adapters need no hub, and the simulator reads only their adapter_config.json."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cluster import wait_until
from support.realnode import (
    MODEL_SUBDIR,
    RealCluster,
    create_model_volume,
    delete_model_volume,
    real_node_spec,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

CLAIM = "loras"
SYNC_BOUND_SECONDS = 30
"""What the test asserts for a CR edit reaching every replica: well under the kubelet's periodic
ConfigMap refresh (every minute plus jitter; 86 s measured before the operator nudged the pods),
so only the pod-annotation path passes it, with a loaded machine's slack (1.0 s measured)."""


@pytest.fixture
def adapter_volume(real_cluster: RealCluster, e2e_namespace: str, tmp_path: Path) -> Iterator[None]:
    """The claim `loras`: a model folder with two adapters in it (rank 8, q/v projections)."""
    for name in ("sql", "chat"):
        folder = tmp_path / "adapters" / name
        folder.mkdir(parents=True)
        config = {
            "peft_type": "LORA",
            "base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",
            "r": 8,
            "lora_alpha": 16,
            "target_modules": ["q_proj", "v_proj"],
            "bias": "none",
        }
        (folder / "adapter_config.json").write_text(json.dumps(config))
        (folder / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    (tmp_path / "config.json").write_text("{}")
    pv = create_model_volume(real_cluster.cluster, e2e_namespace, CLAIM, tmp_path)
    try:
        yield
    finally:
        delete_model_volume(real_cluster.cluster, pv)


def adapter(name: str) -> dict[str, str]:
    return {"name": name, "source": f"pvc://{CLAIM}/{MODEL_SUBDIR}/adapters/{name}"}


def engine_pods(rc: RealCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    pods = rc.kit.kube.list(
        "v1", "Pod", namespace, label_selector=f"serving.llmop.dev/deployment={name}"
    )
    return sorted(
        (p for p in pods if not p["metadata"].get("deletionTimestamp")),
        key=lambda p: p["metadata"]["name"],
    )


def served(ip: str) -> set[str]:
    """The model ids one engine lists (`/v1/models`), empty when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/v1/models", timeout=5) as answer:
            return {m["id"] for m in json.load(answer)["data"]}
    except (OSError, ValueError):
        return set()


def complete(ip: str, model: str) -> int:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://{ip}:8000/v1/completions", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def restarts(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or [])


def phases(rc: RealCluster, namespace: str, name: str) -> dict[str, tuple[str, int, int]]:
    status = (rc.kit.get_llmd(namespace, name) or {}).get("status") or {}
    return {
        a["name"]: (a["phase"], a["readyReplicas"], a["replicas"])
        for a in status.get("adapters") or []
    }


def test_adapters_follow_the_cr_without_restarting_a_pod(
    real_cluster: RealCluster, e2e_namespace: str, adapter_volume: None
) -> None:
    rc, ns, name = real_cluster, e2e_namespace, "loras"
    spec = real_node_spec(
        replicas=2,
        model={"name": f"pvc://{CLAIM}/{MODEL_SUBDIR}"},
        engine={"lora": {"maxLoras": 2, "maxCpuLoras": 4, "maxLoraRank": 16}},
        adapters=[adapter("sql")],
    )
    rc.kit.apply_llmd(ns, name, spec)
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=240)
    wait_until(
        lambda: phases(rc, ns, name) == {"sql": ("Ready", 2, 2)}, timeout=60, what="sql on both"
    )
    pods = engine_pods(rc, ns, name)
    ips = [p["status"]["podIP"] for p in pods]
    assert all("sql" in served(ip) for ip in ips)
    assert all(complete(ip, "sql") == 200 for ip in ips)
    before = {p["metadata"]["name"]: (p["metadata"]["uid"], restarts(p)) for p in pods}
    template_before = rc.kit.deployment(ns, name)["spec"]["template"]  # type: ignore[index]

    # Add an adapter: every replica serves it, no pod restarts, the template stays as it was.
    edited = time.monotonic()
    rc.kit.apply_llmd(ns, name, spec | {"adapters": [adapter("sql"), adapter("chat")]})
    wait_until(
        lambda: all("chat" in served(ip) for ip in ips),
        timeout=SYNC_BOUND_SECONDS,
        interval=1,
        what="chat on every replica",
    )
    sync_seconds = time.monotonic() - edited
    print(f"\nCR edit -> both replicas serving the new adapter: {sync_seconds:.1f} s")
    assert sync_seconds <= SYNC_BOUND_SECONDS
    assert all(complete(ip, "chat") == 200 for ip in ips)
    after = {
        p["metadata"]["name"]: (p["metadata"]["uid"], restarts(p))
        for p in engine_pods(rc, ns, name)
    }
    assert after == before
    assert rc.kit.deployment(ns, name)["spec"]["template"] == template_before  # type: ignore[index]
    wait_until(
        lambda: phases(rc, ns, name) == {"sql": ("Ready", 2, 2), "chat": ("Ready", 2, 2)},
        timeout=30,
        what="status: both adapters on both replicas",
    )

    # Remove one: unloaded from both, requests for it get 404, the other still serves.
    edited = time.monotonic()
    rc.kit.apply_llmd(ns, name, spec | {"adapters": [adapter("chat")]})
    wait_until(
        lambda: all("sql" not in served(ip) for ip in ips),
        timeout=SYNC_BOUND_SECONDS,
        interval=1,
        what="sql unloaded everywhere",
    )
    gone = time.monotonic() - edited
    print(f"CR edit -> the removed adapter gone from both replicas: {gone:.1f} s")
    assert all(complete(ip, "sql") == 404 for ip in ips)
    assert all(complete(ip, "chat") == 200 for ip in ips)

    # A new replica is Ready only with every adapter loaded: watched from its first answer
    # until Ready, no sample may show it Ready without the adapter.
    rc.kit.apply_llmd(ns, name, spec | {"adapters": [adapter("chat")], "replicas": 3})

    def third() -> dict[str, Any] | None:
        fresh = [p for p in engine_pods(rc, ns, name) if p["metadata"]["name"] not in before]
        return fresh[0] if fresh and fresh[0]["status"].get("podIP") else None

    new_pod = wait_until(third, timeout=120, interval=0.5, what="the third replica's IP")
    ip, pod_name = new_pod["status"]["podIP"], new_pod["metadata"]["name"]
    samples: list[tuple[bool, bool]] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        pod = rc.kit.kube.read("v1", "Pod", ns, pod_name) or {}
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        samples.append((ready, "chat" in served(ip)))
        if ready:
            break
        time.sleep(0.3)
    assert samples
    assert samples[-1][0], "the third replica never became Ready"
    assert all(has for ready, has in samples if ready)
    assert complete(ip, "chat") == 200
    wait_until(lambda: phases(rc, ns, name) == {"chat": ("Ready", 3, 3)}, timeout=30, what="3/3")
