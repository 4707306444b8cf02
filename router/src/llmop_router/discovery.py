"""Pure: from LLMDeployments and their Services' EndpointSlices to the routing table's entries.

A CR is routed unless `spec.router.enabled` is false; its model name is `spec.model.servedName`,
else its own name, and each of its LoRA adapters (`spec.adapters[].name`) is a model name of
its own on the same endpoints (every replica loads every adapter). Its endpoints are the ready,
non-terminating addresses of the EndpointSlices of its Service (named like the CR) on the port
named `http`: a pod that started terminating leaves at once even while its readiness still
passes (production-stack#601).

When two CRs claim one model name, the operator decides which owns it (`llmop.name_owners`:
stable across the owner being recreated) and writes the names each CR owns into its
`status.routing.servedNames`: a name is routed only to a CR whose status lists it, and to none
while its claimants carry `status.routing` but none lists it (an owner recreated a moment ago).
Only where no claimant of a name carries `status.routing` (an operator of an older version; a
CR before its first status, unless the router is told the operator decides names:
`--await-name-decisions`, which the chart sets) the oldest claimant keeps it (then
namespace/name order), the same on every replica. The operator writes an undecided CR as
owning nothing, so with it a name reserved to a deleted owner never goes to a newcomer. A CR
outside the namespaces allowed to serve (`servingNamespaces`, the chart's
router.servingNamespaces; empty: all) is not routed at all.

Endpoints not ready yet and not terminating are kept too, with their agent's address: while
requests wait for a waking CR the router asks those agents itself (`scale_to_zero`), and one
that answered ready is routed at once instead of after the kubelet's next readiness probe and
the EndpointSlice's update (Knative's activator probes the pods it wakes for the same reason).
That lasts until its slice says ready, or no longer lists it as starting.

The catalog also knows how fresh its view is: when each list last heard from the API server (a
list, a watch opened, an event or a bookmark) and the watch's last failure, so a table the
watches stopped updating is reported stale instead of served as current for ever. Time is a
parameter here (the caller's monotonic clock).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from llmop_router import contract
from llmop_router.contract import Spec, Status
from llmop_router.hold import DEFAULT_CONCURRENCY, ScaleToZero
from llmop_router.routes import Fallback, RouteTable, Wake

API_PORT_NAME = contract.API_PORT_NAME
"""The engine Service's API port name (the operator's renderer names it so)."""
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
ENDPOINT_SLICES = "endpointslices"

Key = tuple[str, str]
"""(namespace, name)"""


@dataclass(frozen=True)
class Claim:
    """A routed CR and the model name it serves."""

    namespace: str
    name: str
    model: str
    created: str
    wake: Wake = field(default_factory=Wake)
    adapters: tuple[str, ...] = ()
    """The CR's LoRA adapter names: routed like `model`, to the same pods."""
    owned: tuple[str, ...] | None = None
    """The names the operator decided this CR owns (`status.routing.servedNames`); None: its
    status says nothing of ownership yet."""
    migration_limit: int | None = None
    """`spec.router.migrationLimit`; None: the router's own flag."""
    fallback: tuple[Fallback, ...] = ()
    """`spec.router.fallback`, in order (entries the router cannot read left out)."""
    revisions: tuple[tuple[str, str], ...] | None = None
    """(pod name, model revision) from `status.routing.modelRevisions`; None: the status says
    nothing of revisions (an operator of an older version), so migration is not pinned."""
    gpus: int = 0
    """GPUs behind each endpoint: `spec.resources.gpus` times the pods of a multi-node group."""
    engine_key: bool = False
    """The engine wants its own API key (`spec.service.apiKeySecretRef`)."""
    adapter_revisions: dict[str, str | None] | None = None
    """Adapter name → what a stream of it is pinned to (its revision while settled; None:
    not settled, no stream of it continued), from `status.routing.adapterRevisions`; None:
    the status says nothing of adapters' revisions."""

    @property
    def models(self) -> tuple[str, ...]:
        """Every model name the CR serves: the base first, then its adapters."""
        return (self.model, *self.adapters)


def wake_of(llmd: Mapping[str, Any]) -> Wake:
    """Whether a CR is at zero by the operator's word (Ready, reason `ScaledToZero`, and
    autoscaled with `minReplicas: 0`), its scale-to-zero settings, which workload to wake and how
    many requests a pod takes at once (`status.plan.maxNumSeqs`, as the operator planned the
    engine)."""
    spec = llmd.get("spec") or {}
    engine = spec.get(Spec.ENGINE) or {}
    status = llmd.get("status") or {}
    # A fixed `spec.replicas: 0` also reads Ready/ScaledToZero; only the autoscaled floor of 0
    # is the operator's to leave, so only that one may be woken.
    opted_in = (spec.get(Spec.AUTOSCALING) or {}).get(Spec.MIN_REPLICAS) == 0
    conditions = status.get(Status.CONDITIONS) or []
    ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == contract.READY), {})
    seqs = (status.get(Status.PLAN) or {}).get(Status.MAX_NUM_SEQS)
    return Wake(
        scaled_to_zero=opted_in
        and ready.get("status") == "True"
        and ready.get("reason") == contract.REASON_SCALED_TO_ZERO,
        settings=ScaleToZero.of(spec),
        workload=contract.workload_resource(engine.get(Spec.PIPELINE_PARALLEL_SIZE)),
        concurrency=seqs
        if isinstance(seqs, int) and not isinstance(seqs, bool) and seqs > 0
        else DEFAULT_CONCURRENCY,
    )


def claim_of(llmd: Mapping[str, Any]) -> Claim | None:
    """The model a CR asks the router to serve, or None (routing off, or no name yet)."""
    meta = llmd.get("metadata") or {}
    spec = llmd.get("spec") or {}
    router = spec.get(Spec.ROUTER) or {}
    if router.get(Spec.ENABLED) is False:
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not namespace or not name:
        return None
    model = (spec.get(Spec.MODEL) or {}).get(Spec.SERVED_NAME) or name
    adapters = tuple(
        str(a[Spec.ADAPTER_NAME])
        for a in spec.get(Spec.ADAPTERS) or []
        if isinstance(a, Mapping) and isinstance(a.get(Spec.ADAPTER_NAME), str)
    )
    created = meta.get("creationTimestamp") or ""
    limit = router.get(Spec.MIGRATION_LIMIT)
    return Claim(
        namespace,
        name,
        model,
        created,
        wake_of(llmd),
        adapters,
        owned_of(llmd),
        limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 else None,
        fallback_of(router.get(Spec.FALLBACK), (model, *adapters)),
        revisions_of(llmd),
        gpus_of(spec),
        engine_key_of(spec),
        adapter_revisions_of(llmd),
    )


def claim_of_seen(llmd: Mapping[str, Any], *, await_decisions: bool) -> Claim | None:
    """`claim_of`, where the operator decides names (`await_decisions`): a CR with no status
    at all (the operator has not seen it yet) owns nothing until its status says otherwise.
    Else it would be routed by the rule for operators that predate names (the oldest
    claimant): a new CR claiming a name reserved to a deleted owner, with no other claimant,
    would get it until its first status, to pods of a Service of its name made beforehand.
    A status without `routing` still falls back (an operator that predates names)."""
    claim = claim_of(llmd)
    if claim is None or not await_decisions or claim.owned is not None or llmd.get("status"):
        return claim
    return replace(claim, owned=())


def engine_key_of(spec: Mapping[str, Any]) -> bool:
    """The engine wants its own API key (`spec.service.apiKeySecretRef` set)."""
    service = spec.get(Spec.SERVICE)
    return isinstance(service, Mapping) and bool(service.get(Spec.SERVICE_API_KEY_SECRET_REF))


def gpus_of(spec: Mapping[str, Any]) -> int:
    """GPUs behind one endpoint of the CR: `spec.resources.gpus` (default 1) in each of the
    `spec.engine.pipelineParallelSize` pods of a replica (default 1); 0 for anything malformed."""
    gpus = (spec.get(Spec.RESOURCES) or {}).get(Spec.GPUS, 1)
    pods = (spec.get(Spec.ENGINE) or {}).get(Spec.PIPELINE_PARALLEL_SIZE, 1)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (gpus, pods)):
        return 0
    return int(gpus) * max(1, int(pods))


def fallback_of(raw: object, own: tuple[str, ...]) -> tuple[Fallback, ...]:
    """`spec.router.fallback` as the router uses it: entries naming one of the CR's own models
    are left out (a fallback to itself is no fallback), as is anything malformed (the API
    server refuses it first). An `externalModel` entry names an `LLMExternalModel`."""
    if not isinstance(raw, list):
        return ()
    found = []
    for entry in raw[: contract.MAX_FALLBACKS]:
        if not isinstance(entry, Mapping):
            continue
        model = entry.get(Spec.FALLBACK_MODEL)
        external = entry.get(Spec.FALLBACK_EXTERNAL_MODEL)
        when = entry.get(Spec.FALLBACK_WHEN) or [contract.WHEN_UNAVAILABLE]
        if not isinstance(when, list) or (model is None) == (external is None):
            continue
        if external is not None:
            if isinstance(external, str) and external:
                found.append(_fallback(entry, external, when, external=True))
            continue
        if not isinstance(model, str) or not model or model in own:
            continue
        found.append(_fallback(entry, model, when))
    return tuple(found)


def _fallback(
    entry: Mapping[str, Any], model: str, when: list[object], *, external: bool = False
) -> Fallback:
    after = entry.get(Spec.FALLBACK_AFTER_SECONDS, contract.DEFAULT_FALLBACK_AFTER_SECONDS)
    if isinstance(after, bool) or not isinstance(after, int | float) or after <= 0:
        after = contract.DEFAULT_FALLBACK_AFTER_SECONDS
    return Fallback(
        model,
        unavailable=contract.WHEN_UNAVAILABLE in when,
        saturated_after=float(after) if contract.WHEN_SATURATED in when else None,
        external=external,
    )


def owned_of(llmd: Mapping[str, Any]) -> tuple[str, ...] | None:
    """`status.routing.servedNames`, or None when the status has no `routing` (not decided)."""
    routing = (llmd.get("status") or {}).get(Status.ROUTING)
    if not isinstance(routing, Mapping):
        return None
    names = routing.get(Status.SERVED_NAMES) or []
    return tuple(str(n) for n in names if isinstance(n, str)) if isinstance(names, list) else ()


def _routing_list(llmd: Mapping[str, Any], key: str) -> list[Any] | None:
    """`status.routing.<key>` ([] when it is not a list); None when the status does not carry
    the key (an operator that predates it)."""
    routing = (llmd.get("status") or {}).get(Status.ROUTING)
    if not isinstance(routing, Mapping) or key not in routing:
        return None
    entries = routing.get(key)
    return entries if isinstance(entries, list) else []


MAX_REVISION_PODS = 2000
"""Pods read from `status.routing.modelRevisions` at most (the operator lists no more)."""


def revisions_of(llmd: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """`status.routing.modelRevisions` as (pod, revision) pairs; None when the status does not
    carry the key (not pinned: the operator predates it). Malformed entries are left out: their
    pods are then no target for a continued stream."""
    entries = _routing_list(llmd, Status.MODEL_REVISIONS)
    if entries is None:
        return None
    found: list[tuple[str, str]] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        revision, pods = entry.get(Status.REVISION), entry.get(Status.PODS)
        if not isinstance(revision, str) or not isinstance(pods, list):
            continue
        found += [(pod, revision) for pod in pods if isinstance(pod, str)]
    return tuple(found[:MAX_REVISION_PODS])


def adapter_revisions_of(llmd: Mapping[str, Any]) -> dict[str, str | None] | None:
    """`status.routing.adapterRevisions` as adapter name → pin (`revision:<r>` while settled,
    None while not); None when the status does not carry the key."""
    entries = _routing_list(llmd, Status.ADAPTER_REVISIONS)
    if entries is None:
        return None
    found: dict[str, str | None] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get(Status.NAME), str):
            continue
        revision = entry.get(Status.REVISION)
        settled = entry.get(Status.SETTLED) is True
        pin = f"revision:{revision}" if isinstance(revision, str) else "no revision"
        found[entry[Status.NAME]] = pin if settled else None
    return found


def served_revisions(
    pods: Mapping[str, str], claim: Claim | None, model: str
) -> dict[str, str] | None:
    """Endpoint → what a stream of `model` begun there is pinned to: the pod's model revision
    (`endpoint_revisions`), and for an adapter also the adapter's (no endpoint while it is not
    settled: its files may be changing on some replicas). None: not pinned."""
    if claim is None:
        return None
    revisions = endpoint_revisions(pods, claim.revisions)
    adapters = claim.adapter_revisions
    if revisions is None or adapters is None or model == claim.model or model not in adapters:
        return revisions
    pin = adapters[model]
    if pin is None:
        return {}
    return {endpoint: f"{revision} adapter {pin}" for endpoint, revision in revisions.items()}


def owners(claims: Iterable[Claim]) -> dict[str, Claim]:
    """Model name → the one CR that serves it; adapter names count as model names. A name some
    claimant's status decides (`owned` not None) goes to the first claimant whose status lists
    it, or to none; a name no claimant's status decides, to the oldest claimant (then
    namespace/name)."""
    ordered = sorted(claims, key=lambda c: (c.created, c.namespace, c.name))
    by_model: dict[str, list[Claim]] = {}
    for claim in ordered:
        for model in dict.fromkeys(claim.models):
            by_model.setdefault(model, []).append(claim)
    chosen: dict[str, Claim] = {}
    for model, claiming in by_model.items():
        if all(c.owned is None for c in claiming):
            chosen[model] = claiming[0]
            continue
        owner = next((c for c in claiming if c.owned is not None and model in c.owned), None)
        if owner is not None:
            chosen[model] = owner
    return chosen


def service_of(endpoint_slice: Mapping[str, Any]) -> Key | None:
    """The Service (namespace, name) an EndpointSlice belongs to."""
    meta = endpoint_slice.get("metadata") or {}
    service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    namespace = meta.get("namespace")
    return (namespace, service) if namespace and service else None


def ready_endpoints(slices: Iterable[Mapping[str, Any]]) -> list[str]:
    """`ip:port` of every ready, non-terminating endpoint on the `http` port, sorted."""
    return sorted(ready_pods(slices))


def _slice_endpoints(
    slices: Iterable[Mapping[str, Any]],
) -> Iterator[tuple[Mapping[str, Any], str, str, dict[str, Any]]]:
    """Each IP endpoint of `slices`: its conditions, its host (an IPv6 one bracketed), the pod
    behind it (its `targetRef`; "" when it names none) and its slice's ports by name."""
    for endpoint_slice in slices:
        if endpoint_slice.get("addressType", "IPv4") not in ("IPv4", "IPv6"):
            continue
        ports = {p.get("name"): p.get("port") for p in endpoint_slice.get("ports") or []}
        for endpoint in endpoint_slice.get("endpoints") or []:
            target = endpoint.get("targetRef") or {}
            pod = str(target.get("name") or "") if target.get("kind", "Pod") == "Pod" else ""
            for address in (endpoint.get("addresses") or [])[:1]:
                host = f"[{address}]" if ":" in address else address
                yield endpoint.get("conditions") or {}, host, pod, ports


def starting_pods(slices: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Endpoints not ready yet and not terminating (a pod starting, or one its readiness probe
    turned away), each → (the pod behind it, its agent's `ip:port`): what the router may ask
    itself while requests wait for a waking CR. Slices without the agent's port give none."""
    found: dict[str, tuple[str, str]] = {}
    for conditions, host, pod, ports in _slice_endpoints(slices):
        api, agent = ports.get(API_PORT_NAME), ports.get(contract.AGENT_PORT_NAME)
        if conditions.get("ready") is not False or conditions.get("terminating") is True:
            continue
        if isinstance(api, int) and isinstance(agent, int):
            found[f"{host}:{api}"] = (pod, f"{host}:{agent}")
    return found


def ready_pods(slices: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """`ready_endpoints`, each with the name of the pod behind it (its `targetRef`; "" when
    the endpoint names no pod)."""
    found: dict[str, str] = {}
    for conditions, host, pod, ports in _slice_endpoints(slices):
        # `ready` unset means ready (EndpointSlice API); terminating pods are never picked.
        if conditions.get("ready") is False or conditions.get("terminating") is True:
            continue
        if (port := ports.get(API_PORT_NAME)) is not None:
            found[f"{host}:{port}"] = pod
    return found


@dataclass
class Catalog:
    """What the watches have seen, kept just large enough to fill a `RouteTable`: the claims
    of the CRs and the endpoint lists of their Services. Fed one event at a time."""

    table: RouteTable
    namespaces: tuple[str, ...] = ()
    """The namespaces watched; empty: all."""
    serving: tuple[str, ...] = ()
    """The namespaces whose CRs may be routed (`--serving-namespaces`); empty: all."""
    await_decisions: bool = False
    """`--await-name-decisions`: the operator decides names, so a CR it has not written a
    status for yet owns nothing until it has (see `claim_of_seen`)."""
    claims: dict[Key, Claim] = field(default_factory=dict)
    slices: dict[Key, dict[str, dict[str, str]]] = field(default_factory=dict)
    """Service → EndpointSlice name → its ready endpoints → the pod behind each."""
    starting: dict[Key, dict[str, dict[str, tuple[str, str]]]] = field(default_factory=dict)
    """Service → EndpointSlice name → its `starting_pods`."""
    confirmed: dict[Key, set[str]] = field(default_factory=dict)
    """Service → its starting endpoints whose agent answered ready to the router itself
    (`confirm_ready`): routed like ready ones until their slice says ready (then they are
    ready) or drops them, and forgotten then, so a later not-ready is obeyed."""
    synced: set[str] = field(default_factory=set)
    problems: dict[str, str] = field(default_factory=dict)
    """List → why it cannot be listed now (the CRD not installed, RBAC), as the watch says."""
    contacts: dict[str, float] = field(default_factory=dict)
    """List → when its watch last heard from the API server (a list, a watch opened, an event
    or a bookmark)."""
    errors: dict[str, str] = field(default_factory=dict)
    """List → its watch's last failure, until it next hears from the API server."""
    _served: dict[Key, list[str]] = field(default_factory=dict)
    """CR → the model names it owns in the table now."""
    cluster_lists: tuple[str, ...] = ()
    """Cluster-scoped resources the router also needs listed before it is ready (the
    gateway's `llmtenants`): their events go elsewhere, their list is marked by `listed`."""

    def listed(self, resource: str) -> None:
        """A cluster-scoped list of `cluster_lists` arrived."""
        self.synced.add(list_key(resource, None))

    def on_llmdeployment(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "SYNC":
            scope = obj.get("namespace")
            self.claims = {k: c for k, c in self.claims.items() if not _in(k, scope)}
            for item in obj.get("items") or []:
                self._store_claim(item)
            self.synced.add(list_key(contract.PLURAL, scope))
        elif kind == "DELETED":
            self.claims.pop(_key(obj), None)
        else:
            self.claims.pop(_key(obj), None)
            self._store_claim(obj)
        self._assign_models()

    def on_endpoint_slice(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "SYNC":
            scope = obj.get("namespace")
            self.slices = {k: v for k, v in self.slices.items() if not _in(k, scope)}
            self.starting = {k: v for k, v in self.starting.items() if not _in(k, scope)}
            for item in obj.get("items") or []:
                self._store_slice(item)
            for known in list(self.confirmed):
                self._forget_unstarting(known)
            self.synced.add(list_key(ENDPOINT_SLICES, scope))
            self._assign_models()
            return
        service = service_of(obj)
        if service is None:
            return
        name = (obj.get("metadata") or {}).get("name", "")
        if kind == "DELETED":
            self.slices.get(service, {}).pop(name, None)
            self.starting.get(service, {}).pop(name, None)
        else:
            self._store_slice(obj)
        self._forget_unstarting(service)
        self._refresh(service)

    def starting_agents(self, service: Key) -> dict[str, str]:
        """The service's starting endpoints not confirmed yet → their agents' `ip:port`."""
        confirmed = self.confirmed.get(service, set())
        return {
            endpoint: agent
            for found in self.starting.get(service, {}).values()
            for endpoint, (_pod, agent) in found.items()
            if endpoint not in confirmed
        }

    def confirm_ready(self, service: Key, endpoint: str) -> None:
        """A starting endpoint's agent answered ready to the router: it is routed from now on,
        while its slice still lists it as starting (an endpoint it does not list: nothing)."""
        if endpoint in self._starting_endpoints(service):
            self.confirmed.setdefault(service, set()).add(endpoint)
            self._refresh(service)

    def _starting_endpoints(self, service: Key) -> set[str]:
        return {e for found in self.starting.get(service, {}).values() for e in found}

    def _forget_unstarting(self, service: Key) -> None:
        """Confirmations of endpoints no longer starting go: ready now, gone or terminating."""
        confirmed = self.confirmed.get(service)
        if confirmed is None:
            return
        confirmed &= self._starting_endpoints(service)
        if not confirmed:
            del self.confirmed[service]

    def _refresh(self, service: Key) -> None:
        """The table's entries of the service's models, after its endpoints changed."""
        claim = self.claims.get(service)
        wake = claim.wake if claim is not None else None
        limit = claim.migration_limit if claim is not None else None
        fallback = claim.fallback if claim is not None else ()
        pods = self.pods(service)
        for model in self._served.get(service, ()):
            self.table.set(
                model,
                *service,
                pods,
                wake,
                migration_limit=limit,
                fallback=fallback,
                revisions=served_revisions(pods, claim, model),
                gpus=claim.gpus if claim is not None and model == claim.model else 0,
                engine_key=claim is not None and claim.engine_key,
            )

    @property
    def ready(self) -> bool:
        """Every list arrived (both resources, each watched namespace): the table is complete."""
        return not self.waiting()

    def wanted(self) -> list[str]:
        """The lists the table needs: both resources, in each watched namespace (or all)."""
        scopes = self.namespaces or ("",)
        wanted = [list_key(r, ns) for r in (contract.PLURAL, ENDPOINT_SLICES) for ns in scopes]
        return wanted + [list_key(r, None) for r in self.cluster_lists]

    def waiting(self) -> list[str]:
        """What readiness waits for, one line per list that has not arrived: why it cannot be
        listed when the watch knows (`problem`), else that it is being listed."""
        return [
            self.problems.get(key) or f"listing {key.rstrip('/')}"
            for key in self.wanted()
            if key not in self.synced
        ]

    def started(self, now: float) -> None:
        """The watches start: each list's age counts from here until it first succeeds."""
        for key in self.wanted():
            self.contacts.setdefault(key, now)

    def contact(self, key: str, now: float) -> None:
        """The watch of list `key` heard from the API server: the view of it is current."""
        self.contacts[key] = now
        self.errors.pop(key, None)

    def failed(self, key: str, message: str) -> None:
        """The watch of list `key` failed (it retries): said while the view goes stale."""
        self.errors[key] = message

    def ages(self, now: float) -> dict[str, float]:
        """Per resource: seconds since its stalest list (of the watched namespaces) last heard
        from the API server."""
        found: dict[str, float] = {}
        for key in self.wanted():
            resource = key.partition("/")[0]
            age = max(0.0, now - self.contacts.get(key, now))
            found[resource] = max(found.get(resource, 0.0), age)
        return found

    def stale(self, now: float, bound: float) -> list[str]:
        """One line per list that arrived once but has not heard from the API server for more
        than `bound` seconds: the table may miss changes since (a list not arrived yet is
        `waiting`'s)."""
        found = []
        for key in self.wanted():
            age = now - self.contacts.get(key, now)
            if key not in self.synced or age <= bound:
                continue
            resource, _, namespace = key.partition("/")
            where = f"in namespace {namespace}" if namespace else "in every namespace"
            why = self.problems.get(key) or self.errors.get(key) or "no answer yet"
            found.append(
                f"stale: no list or watch event of {resource} {where} for {age:.0f} s "
                f"(more than the {bound:g} s of --stale-after-seconds), so the table may miss "
                f"changes since; the watch retries; last error: {why}"
            )
        return found

    def problem(self, key: str, message: str | None) -> None:
        """Record why the list `key` cannot be listed now (None: it can again)."""
        if message is None:
            self.problems.pop(key, None)
        else:
            self.problems[key] = message

    def endpoints(self, service: Key) -> list[str]:
        return sorted(self.pods(service))

    def pods(self, service: Key) -> dict[str, str]:
        """The service's ready endpoints, and its starting ones the router confirmed ready
        itself, → the pod behind each ("" when unknown)."""
        pods = {
            e: pod for found in self.slices.get(service, {}).values() for e, pod in found.items()
        }
        confirmed = self.confirmed.get(service)
        if confirmed:
            for found in self.starting.get(service, {}).values():
                pods.update({e: pod for e, (pod, _agent) in found.items() if e in confirmed})
        return pods

    def _store_claim(self, obj: Mapping[str, Any]) -> None:
        claim = claim_of_seen(obj, await_decisions=self.await_decisions)
        if claim is not None and (not self.serving or claim.namespace in self.serving):
            self.claims[(claim.namespace, claim.name)] = claim

    def _store_slice(self, obj: Mapping[str, Any]) -> None:
        service = service_of(obj)
        if service is not None:
            name = (obj.get("metadata") or {}).get("name", "")
            self.slices.setdefault(service, {})[name] = ready_pods([obj])
            self.starting.setdefault(service, {})[name] = starting_pods([obj])

    def _assign_models(self) -> None:
        chosen = owners(self.claims.values())
        served: dict[Key, list[str]] = {}
        for model, claim in chosen.items():
            served.setdefault((claim.namespace, claim.name), []).append(model)
        for model in set(self.table.backends) - set(chosen):
            self.table.remove(model)
        for model, claim in chosen.items():
            key = (claim.namespace, claim.name)
            pods = self.pods(key)
            self.table.set(
                model,
                claim.namespace,
                claim.name,
                pods,
                claim.wake,
                migration_limit=claim.migration_limit,
                fallback=claim.fallback,
                revisions=served_revisions(pods, claim, model),
                # The CR's GPUs counted once, on its served name (not again on its adapters').
                gpus=claim.gpus if model == claim.model else 0,
                engine_key=claim.engine_key,
            )
        self._served = served


def endpoint_revisions(
    pods: Mapping[str, str], revisions: tuple[tuple[str, str], ...] | None
) -> dict[str, str] | None:
    """Endpoint → the model revision of the pod behind it (endpoints of pods the status does
    not list are left out); None when the CR's status carries no revisions."""
    if revisions is None:
        return None
    by_pod = dict(revisions)
    return {e: by_pod[pod] for e, pod in pods.items() if pod and pod in by_pod}


def list_key(resource: str, namespace: str | None) -> str:
    """The name of one list the table needs: `<resource>/<namespace>` (`<resource>/` for all)."""
    return f"{resource}/{namespace or ''}"


def _in(key: Key, namespace: str | None) -> bool:
    """Whether a (namespace, name) falls in a list's scope (None: every namespace)."""
    return namespace is None or key[0] == namespace


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))
