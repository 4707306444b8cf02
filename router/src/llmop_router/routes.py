"""The routing table: which engine pods serve each model name, with each model's ring and the
router's in-flight count per pod. Written by the watch (or a static file), read by the proxy;
both run on one event loop, so no locks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmop_router.ring import Pick, Ring, pick


@dataclass
class Backend:
    """One routed LLMDeployment: its identity and its ready, non-terminating engine endpoints."""

    namespace: str
    name: str
    ring: Ring = field(default_factory=lambda: Ring.of(()))


@dataclass
class RouteTable:
    """Model name → backend, plus the in-flight requests per endpoint (`ip:port`)."""

    backends: dict[str, Backend] = field(default_factory=dict)
    in_flight: Counter[str] = field(default_factory=Counter)

    def set(self, model: str, namespace: str, name: str, endpoints: Iterable[str]) -> None:
        """Route `model` to these endpoints (the ring is rebuilt only when the set changed)."""
        wanted = tuple(sorted(set(endpoints)))
        current = self.backends.get(model)
        if current is not None and current.ring.endpoints == wanted:
            current.namespace, current.name = namespace, name
            return
        self.backends[model] = Backend(namespace, name, Ring.of(wanted))

    def remove(self, model: str) -> None:
        self.backends.pop(model, None)

    def models(self) -> list[str]:
        return sorted(self.backends)

    def choose(self, model: str, key: int | None) -> Pick | None:
        """The endpoints to try for a request, best first; None when the model is unknown."""
        backend = self.backends.get(model)
        if backend is None:
            return None
        return pick(backend.ring, key, self.in_flight)
