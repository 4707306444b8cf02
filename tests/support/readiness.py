"""Watch every LLMDeployment of a namespace and count Ready flaps: a CR whose Ready condition
went True → False → True at one generation (what kstatus clients such as Argo CD, Flux and
`kubectl wait` read as a regression). A real watch, not polling, so short dips are seen.
Used by the burst integration test and by bench/operator_bench.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
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


def watch_objects(
    list_func: Any,
    args: tuple[str, ...],
    stop: threading.Event,
    on_event: Callable[[str, dict[str, Any]], None],
) -> None:
    """Call `on_event(type, object)` for every watch event of `list_func(*args)` (raw JSON
    objects) until `stop` is set, resuming from the last resourceVersion, and from a fresh list
    after 410 Gone or an API error."""
    from kubernetes import client, watch

    version = ""
    while not stop.is_set():
        try:
            for event in watch.Watch().stream(
                list_func,
                *args,
                resource_version=version or None,
                timeout_seconds=5,
                deserialize=False,
            ):
                obj = event["object"]
                if event["type"] == "ERROR":  # 410 Gone: start over with a fresh list
                    version = ""
                    break
                version = obj["metadata"].get("resourceVersion", version)
                on_event(event["type"], obj)
                if stop.is_set():
                    break
        except client.ApiException:
            version = ""


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
        from kubernetes import client

        api = client.CustomObjectsApi(self.api_client)
        args = (API_GROUP, API_VERSION, self.namespace, PLURAL)
        watch_objects(
            api.list_namespaced_custom_object, args, self._stop, lambda _, o: self.observe(o)
        )

    def start(self) -> ReadyWatch:
        self._thread = threading.Thread(target=self._run, daemon=True, name="ready-watch")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
