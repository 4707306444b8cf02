"""The routing table: which engine pods serve each model name, with each model's ring and the
router's load per pod (requests in flight, and the prompt it sent there that has had no first
byte back). Written by the watch (or a static file), read by the proxy; both run on one event
loop, so no locks.

`in_flight` is the router's one count of requests being proxied: the ring's load reads it per
pod, the activity report per CR (each pod's requests are counted for the CR they were sent
for) and the in-flight gauge in total."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmop_router.hold import DEFAULT_CONCURRENCY, Key, ScaleToZero
from llmop_router.prefix import NO_PREFILL, Prefill
from llmop_router.ring import Pick, Ring, pick


@dataclass(frozen=True)
class Wake:
    """What the router needs to hold and wake a CR at zero (read from the CR)."""

    scaled_to_zero: bool = False
    """The CR's Ready condition has reason `ScaledToZero`: only then is it woken."""
    settings: ScaleToZero = field(default_factory=ScaleToZero)
    workload: str = "deployments"
    """The scale subresource's resource: `deployments` or `leaderworkersets` (PP > 1)."""
    concurrency: int = DEFAULT_CONCURRENCY
    """Requests in flight per engine pod when releasing held ones (`status.plan.maxNumSeqs`)."""


@dataclass(frozen=True)
class Fallback:
    """Another routed model, or an API outside the cluster, that answers when this one cannot
    (`spec.router.fallback[]`)."""

    model: str
    """The other model's served name, or the `LLMExternalModel`'s name (`external`)."""
    unavailable: bool = True
    """When this model has no ready replica, or every replica tried failed before answering."""
    saturated_after: float | None = None
    """When a request waited this long for a slot (None: never for that)."""
    external: bool = False
    """`model` names an `LLMExternalModel` (an API outside the cluster), not a routed model."""


@dataclass
class Backend:
    """One routed LLMDeployment: its identity and its ready, non-terminating engine endpoints."""

    namespace: str
    name: str
    ring: Ring = field(default_factory=lambda: Ring.of(()))
    wake: Wake = field(default_factory=Wake)
    migration_limit: int | None = None
    """The CR's `spec.router.migrationLimit`; None: the router's `--migration-limit`."""
    fallback: tuple[Fallback, ...] = ()
    """The CR's `spec.router.fallback`, in order."""
    revisions: dict[str, str] | None = None
    """Endpoint → the model revision its pod serves (`status.routing.modelRevisions`); a
    stream is continued only on an endpoint of the revision that began it. None: the CR's
    status carries no revisions, and continuations are not pinned."""
    gpus: int = 0
    """GPUs behind each endpoint (0 on an adapter's name: the CR's are counted on its served
    name), for the GPU-time cost (`llmop_gateway_gpu_cost_per_hour`)."""
    engine_key: bool = False
    """The engine wants its own API key (`spec.service.apiKeySecretRef`)."""


@dataclass(frozen=True)
class Choice:
    """A request's backend and the endpoints to try for it (`RouteTable.choose`)."""

    backend: Backend
    pick: Pick


@dataclass
class RouteTable:
    """Model name → backend, plus the load per endpoint (`ip:port`)."""

    backends: dict[str, Backend] = field(default_factory=dict)
    in_flight: Counter[str] = field(default_factory=Counter)
    """Requests being proxied to each endpoint: the router's one in-flight count."""
    queued: Counter[str] = field(default_factory=Counter)
    """Characters of prompt sent to each endpoint by requests that have had no first byte back
    (`Pick.prefill_on`): the prefill the engine still has to do before they answer."""
    _sent_for: dict[str, Key] = field(default_factory=dict)
    """Endpoint with requests in flight → the CR they were sent for."""

    def set(
        self,
        model: str,
        namespace: str,
        name: str,
        endpoints: Iterable[str],
        wake: Wake | None = None,
        *,
        migration_limit: int | None = None,
        fallback: tuple[Fallback, ...] = (),
        revisions: dict[str, str] | None = None,
        gpus: int = 0,
        engine_key: bool = False,
    ) -> None:
        """Route `model` to these endpoints (the ring is rebuilt only when the set changed).
        `wake`, `migration_limit`, `fallback`, `revisions`, `gpus` and `engine_key` are what
        the CR says; `wake` None (the CR not known) keeps what the backend had of all six."""
        wanted = tuple(sorted(set(endpoints)))
        current = self.backends.get(model)
        if wake is None and current is not None:
            wake, migration_limit = current.wake, current.migration_limit
            fallback, revisions, gpus = current.fallback, current.revisions, current.gpus
            engine_key = current.engine_key
        wake = wake or Wake()
        if current is not None and current.ring.endpoints == wanted:
            current.namespace, current.name = namespace, name
            current.wake, current.migration_limit = wake, migration_limit
            current.fallback, current.revisions, current.gpus = fallback, revisions, gpus
            current.engine_key = engine_key
            return
        self.backends[model] = Backend(
            namespace,
            name,
            Ring.of(wanted),
            wake,
            migration_limit,
            fallback,
            revisions,
            gpus,
            engine_key,
        )

    def remove(self, model: str) -> None:
        self.backends.pop(model, None)

    def models(self) -> list[str]:
        return sorted(self.backends)

    def choose(self, model: str, key: int | None, prefill: Prefill = NO_PREFILL) -> Choice | None:
        """The model's backend and the endpoints to try for a request, best first; None when
        the model is unknown."""
        backend = self.backends.get(model)
        if backend is None:
            return None
        return Choice(backend, pick(backend.ring, key, self.in_flight, self.queued, prefill))

    def start(self, endpoint: str, cr: Key, prefill: int = 0) -> None:
        """A request for `cr` goes to `endpoint`: in flight there until `end`, its `prefill`
        (prompt characters) queued until `answered`."""
        self.in_flight[endpoint] += 1
        self.queued[endpoint] += prefill
        self._sent_for[endpoint] = cr

    def answered(self, endpoint: str, prefill: int) -> None:
        """The request's first byte came back: its prefill is done."""
        self.queued[endpoint] -= prefill
        if self.queued[endpoint] <= 0:
            del self.queued[endpoint]

    def end(self, endpoint: str) -> None:
        """The request to `endpoint` ended (answered, failed or cancelled)."""
        self.in_flight[endpoint] -= 1
        if self.in_flight[endpoint] <= 0:
            del self.in_flight[endpoint]
            self._sent_for.pop(endpoint, None)

    def in_flight_by_cr(self) -> Counter[Key]:
        """Requests being proxied, per CR they were sent for."""
        found: Counter[Key] = Counter()
        for endpoint, count in self.in_flight.items():
            cr = self._sent_for.get(endpoint)
            if cr is not None:
                found[cr] += count
        return found

    def total_in_flight(self) -> int:
        return sum(self.in_flight.values())
