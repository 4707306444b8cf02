"""Watch every LLMDeployment of a namespace and count Ready flaps: a CR whose Ready condition
went True → False → True at one generation (what kstatus clients such as Argo CD, Flux and
`kubectl wait` read as a regression). A real watch, not polling, so short dips are seen.
Used by the burst integration test and by bench/operator_bench.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

API_GROUP = "serving.llmop.dev"
API_VERSION = "v1alpha1"
PLURAL = "llmdeployments"


def is_ready(obj: dict[str, Any]) -> bool:
    """Ready=True for the current generation (kstatus: an unobserved generation is not)."""
    status = obj.get("status") or {}
    return status.get("observedGeneration") == obj["metadata"].get("generation") and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


@dataclass
class ReadyWatch:
    """Counts, per CR and generation, Ready → not Ready → Ready again (`flaps`) and every
    Ready → not Ready step (`dips`)."""

    namespace: str
    api_client: Any
    flaps: int = 0
    dips: int = 0
    flapped: set[str] = field(default_factory=set)
    _ready: dict[str, tuple[int, bool]] = field(default_factory=dict)
    _was_ready_at: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def ready_count(self) -> int:
        with self._lock:
            return sum(1 for _, ready in self._ready.values() if ready)

    def observe(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        generation = obj["metadata"].get("generation", 0)
        ready = is_ready(obj)
        with self._lock:
            previous = self._ready.get(name)
            if (
                ready
                and self._was_ready_at.get(name) == generation
                and previous
                == (
                    generation,
                    False,
                )
            ):
                self.flaps += 1
                self.flapped.add(name)
            if ready:
                self._was_ready_at[name] = generation
            if previous is not None and previous[1] and not ready:
                self.dips += 1
            self._ready[name] = (generation, ready)

    def _run(self) -> None:
        from kubernetes import client, watch

        api = client.CustomObjectsApi(self.api_client)
        version = ""
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                api.list_namespaced_custom_object,
                API_GROUP,
                API_VERSION,
                self.namespace,
                PLURAL,
                resource_version=version or None,
                timeout_seconds=5,
            )
            try:
                for event in stream:
                    obj = event["object"]
                    if event["type"] == "ERROR":  # 410 Gone: start over with a fresh list
                        version = ""
                        break
                    version = obj["metadata"].get("resourceVersion", version)
                    self.observe(obj)
                    if self._stop.is_set():
                        break
            except client.ApiException:
                version = ""

    def start(self) -> ReadyWatch:
        self._thread = threading.Thread(target=self._run, daemon=True, name="ready-watch")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
