"""No takeovers of the kinds the operator does not watch, against the real API server: the
NetworkPolicy (like the ServiceMonitor, InferencePool and LeaderWorkerSet) has no watch cache to
say the child is missing, so until this process has applied it for a CR it is created only
(`Kube.apply(new=True)`), and an object already in its way is judged by `plan.takeover`: someone
else's is left untouched and the CR is Stalled `ChildNameConflict` naming it. Its own module: the
operator here runs with the NetworkPolicy setting, alone (another module's operator would lead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.cluster import wait_until
from support.manifests import simulator_spec
from support.operator import Kit, OperatorProcess

pytestmark = pytest.mark.cluster


def _stalled_on(kit: Kit, namespace: str, name: str, kind: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = kit.get_llmd(namespace, name) or {}
        found = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        stalled = found.get("Stalled") or {}
        if stalled.get("reason") == "ChildNameConflict" and stalled["message"].startswith(kind):
            return stalled
        return None

    result: dict[str, Any] = wait_until(probe, timeout=60, interval=0.3, what=f"{kind} conflict")
    return result


def test_a_kind_not_watched_is_never_taken_over_either(
    operator_kubeconfig: Path, kit: Kit, namespace: str, tmp_path: Path
) -> None:
    """The NetworkPolicy (like the ServiceMonitor, InferencePool and LeaderWorkerSet) is not
    watched: until this process applied it for the CR, it is created only, so someone else's
    NetworkPolicy of the CR's name is left untouched, and the CR says so; a CR with no such
    object in its way gets its own."""
    peers = '{"api": [{"podSelector": {}}], "probe": [{"podSelector": {}}]}'
    process = OperatorProcess(
        operator_kubeconfig, tmp_path / "operator.log", extra_env={"LLMOP_NETWORK_POLICY": peers}
    )
    process.start()
    try:
        foreign = kit.kube.create(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "chat", "namespace": namespace},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "shop"}},
                    "policyTypes": ["Ingress"],
                },
            }
        )
        kit.apply_llmd(namespace, "chat", simulator_spec())
        kit.apply_llmd(namespace, "free", simulator_spec())
        stalled = _stalled_on(kit, namespace, "chat", "NetworkPolicy")
        assert f"NetworkPolicy {namespace}/chat already exists" in stalled["message"]
        now = kit.get("networking.k8s.io/v1", "NetworkPolicy", namespace, "chat")
        assert now is not None
        assert now["metadata"]["resourceVersion"] == foreign["metadata"]["resourceVersion"]
        assert not now["metadata"].get("ownerReferences")
        free_uid = kit.get_llmd(namespace, "free")["metadata"]["uid"]  # type: ignore[index]
        own = wait_until(
            lambda: kit.get("networking.k8s.io/v1", "NetworkPolicy", namespace, "free"),
            timeout=30,
            what="the free CR's NetworkPolicy",
        )
        assert own["metadata"]["ownerReferences"][0]["uid"] == free_uid

        kit.kube.delete("networking.k8s.io/v1", "NetworkPolicy", namespace, "chat")
        kit.wait_condition(namespace, "chat", "Stalled", "False", timeout=60)
        uid = kit.get_llmd(namespace, "chat")["metadata"]["uid"]  # type: ignore[index]
        ours = kit.get("networking.k8s.io/v1", "NetworkPolicy", namespace, "chat")
        assert ours is not None
        assert ours["metadata"]["ownerReferences"][0]["uid"] == uid
    finally:
        process.stop()
