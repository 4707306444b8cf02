"""`llmop-router serve`: the router. Its table comes from watching LLMDeployments and their
EndpointSlices (in a pod with its ServiceAccount, else with `--kubeconfig`), or from a static
JSON file (`--static`, development and benchmarks). The OpenAI routes and health listen on
`--port`; metrics, the table and the activity on `--admin-port`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import aiohttp
from aiohttp import web

from llmop_router import contract, limits
from llmop_router.app import (
    DRAIN_SECONDS,
    SHUTDOWN_DELAY_SECONDS,
    Router,
    serve,
    static_externals,
    static_table,
)
from llmop_router.contract import Spec, Status
from llmop_router.discovery import Catalog, gpus_of, list_key
from llmop_router.engine_load import POLL_SECONDS
from llmop_router.engine_readings import Readings
from llmop_router.externals import (
    READY,
    ExternalModelError,
    key_missing,
    parse_external_model,
    secret_problem,
)
from llmop_router.gateway import Gateway, GpuHourPrice, store_health
from llmop_router.kube import (
    ENDPOINT_SLICES,
    LLMDEPLOYMENTS,
    LLMEXTERNALMODELS,
    LLMPRIORITYCLASSES,
    LLMTENANTS,
    WATCH_TIMEOUT_SECONDS,
    ApiServer,
    Contact,
    Failure,
    Handler,
    Problem,
    list_and_watch,
    patch_status,
    read_secret,
    wake,
)
from llmop_router.metrics import GatewayMetrics, GpuCost
from llmop_router.migration import Settings as MigrationSettings
from llmop_router.priorities import PriorityClass, parse_priority_class
from llmop_router.routes import Backend, RouteTable
from llmop_router.store import Bus, Guarded, Local, Redis, Store
from llmop_router.tenant_status import status_patch
from llmop_router.tenants import Tenant, parse_tenant

log = logging.getLogger("llmop_router.cli")

DEFAULT_PORT = 8080
DEFAULT_STALE_AFTER_SECONDS = 300.0
"""Past this without hearing from the API server the router pod turns unready: long enough to
ride out an API server restart or upgrade, short enough that a pod whose watch is cut off
(a network partition, a credential it can no longer read) leaves the Service's rotation."""


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds, 0 or more")
    return value


def _event_loop_policy() -> None:
    """uvloop where installed: a bare aiohttp passthrough measured on a 2-core machine adds
    ~1.6 ms to the p50 at 200 streams with it and ~5.4 ms without (shared/reference/routing.md
    section 9)."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="llmop-router", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serving = sub.add_parser("serve", help="serve the OpenAI endpoint")
    serving.add_argument("--host", default="0.0.0.0")
    serving.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="the OpenAI routes, /healthz and /readyz"
    )
    serving.add_argument(
        "--admin-port",
        type=int,
        default=contract.DEFAULT_ADMIN_PORT,
        help="/metrics, /routes and /llmop/activity (for the operator and Prometheus; keep it "
        "off the Service clients use: /routes lists every engine pod's address)",
    )
    serving.add_argument(
        "--stale-after-seconds",
        type=_seconds,
        default=DEFAULT_STALE_AFTER_SECONDS,
        help="unready when a watch has not heard from the API server for this long (the table "
        "may miss changes); 0: never",
    )
    serving.add_argument(
        "--shutdown-delay",
        type=float,
        default=SHUTDOWN_DELAY_SECONDS,
        help="seconds to keep serving, unready, after SIGTERM (until the Service drops the pod)",
    )
    serving.add_argument(
        "--drain",
        type=float,
        default=DRAIN_SECONDS,
        help="then, seconds the answers in flight get to finish before they are cut",
    )
    source = serving.add_mutually_exclusive_group()
    source.add_argument("--static", help="routing table from this JSON file (no watch)")
    source.add_argument("--kubeconfig", help="watch with this kubeconfig (default: in-cluster)")
    serving.add_argument(
        "--namespaces",
        default="",
        help="comma-separated namespaces to watch (default: every namespace)",
    )
    serving.add_argument(
        "--serving-namespaces",
        default="",
        help="comma-separated namespaces whose LLMDeployments may be routed; the others' model "
        "names answer 404 (default: every namespace)",
    )
    serving.add_argument(
        "--await-name-decisions",
        action="store_true",
        help="the operator decides which CR owns each model name (the chart's install): a CR "
        "it has not written a status for yet is not routed until it has (without: the oldest "
        "claimant of a name no status decides is routed meanwhile)",
    )
    serving.add_argument(
        "--migration-limit",
        type=int,
        default=MigrationSettings.limit,
        help="times one stream may be continued on another replica after its engine failed "
        'mid-answer (docs/router.md, "Request migration"); 0: off (a cut stream then ends '
        "with an error event)",
    )
    serving.add_argument(
        "--migration-inactivity-seconds",
        type=float,
        default=MigrationSettings.inactivity_seconds,
        help="a stream with no event for this long after its first is taken as hung",
    )
    limits.add_arguments(serving)
    _gateway_arguments(serving)
    args = parser.parse_args(argv)
    bounds = limits.from_args(args)
    if args.migration_inactivity_seconds <= 0:
        parser.error("--migration-inactivity-seconds must be more than 0")
    migration = MigrationSettings(
        limit=max(0, args.migration_limit), inactivity_seconds=args.migration_inactivity_seconds
    )
    if args.admin_port == args.port and args.port != 0:
        parser.error(
            f"--admin-port {args.admin_port} is --port too: give the admin routes their own "
            f"port (default {contract.DEFAULT_ADMIN_PORT})"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    _event_loop_policy()
    if args.static:
        router = Router(static_table(args.static), limits=bounds, migration=migration)
        router.ready = True
        if args.static_tenants is not None:
            router.gateway = _gateway(args, router)
            tenants, classes = static_tenants(args.static_tenants)
            router.gateway.set_tenants(tenants)
            router.gateway.set_classes(classes)
            for cr, entry in static_entries(args.static).items():
                router.gateway.set_price(
                    cr,
                    entry.get("pricing"),
                    gpus=gpus_of({Spec.RESOURCES: {Spec.GPUS: entry.get("gpus", 1)}}),
                    status={Status.PLAN: entry.get("plan")},
                )
            for external, key in static_externals(args.static):
                router.externals.put(external)
                router.externals.key_read(external.name, key, None)
                router.gateway.set_price(external.key, external.pricing)
    else:
        api = ApiServer.from_kubeconfig(args.kubeconfig) if args.kubeconfig else None
        router = Router(RouteTable(), limits=bounds, migration=migration)
        if args.gateway:
            router.gateway = _gateway(args, router)
        namespaces = tuple(ns for ns in args.namespaces.split(",") if ns)
        stale_after = args.stale_after_seconds
        serving_namespaces = tuple(ns.strip() for ns in args.serving_namespaces.split(",") if ns)
        router.app_hooks.append(
            lambda app: watching(
                app,
                router,
                api or ApiServer.in_cluster(),
                namespaces,
                stale_after,
                serving=serving_namespaces,
                external_namespace=args.external_namespace,
                await_decisions=args.await_name_decisions,
            )
        )
    asyncio.run(
        serve(
            router,
            args.host,
            args.port,
            shutdown_delay=args.shutdown_delay,
            drain=args.drain,
            admin_port=args.admin_port,
        )
    )


def _freshness(router: Router, catalog: Catalog, stale_after: float) -> float:
    """Report the watches' age (metric) and staleness (`/readyz`, past `stale_after` seconds;
    0: never); returns how long each watch request may run."""
    catalog.started(time.monotonic())
    router.metrics.watch_ages = lambda: catalog.ages(time.monotonic())
    if stale_after <= 0:
        return WATCH_TIMEOUT_SECONDS
    router.stale = lambda: catalog.stale(time.monotonic(), stale_after)
    # A quiet, healthy watch must make contact well within the bound: reopen it at a third.
    return min(WATCH_TIMEOUT_SECONDS, stale_after / 3)


def _contact(catalog: Catalog, key: str) -> Contact:
    return lambda: catalog.contact(key, time.monotonic())


def _failure(catalog: Catalog, key: str) -> Failure:
    return lambda message: catalog.failed(key, message)


def watching(  # noqa: C901
    app: web.Application,
    router: Router,
    api: ApiServer,
    namespaces: tuple[str, ...],
    stale_after: float = DEFAULT_STALE_AFTER_SECONDS,
    *,
    serving: tuple[str, ...] = (),
    external_namespace: str = "",
    await_decisions: bool = False,
) -> None:
    """Fill the router's table from the watches for as long as the app runs; ready once every
    list arrived (until then `/readyz` says what it waits for: a CRD not installed, say), and
    unready again while a watch has not heard from the API server for `stale_after` seconds
    (0: never). The same credentials wake CRs at zero. Only CRs in `serving` (empty: all) are
    routed, and with `await_decisions` only once the operator has written their status. With
    the gateway and an `external_namespace`, the LLMExternalModels there (and their Secrets)
    are read too; readiness does not wait for them (a fallback is optional)."""
    catalog = Catalog(router.table, namespaces, serving, await_decisions)
    # A waking CR's starting pods, which the router asks itself while requests wait.
    router.holder.starting = catalog
    gateway = router.gateway
    if gateway is not None:
        catalog.cluster_lists = (LLMTENANTS[1], LLMPRIORITYCLASSES[1])
    watch_timeout = _freshness(router, catalog, stale_after)

    def update() -> None:
        router.ready = catalog.ready
        router.waiting = catalog.waiting()

    def on_llmdeployment(kind: str, obj: dict[str, object]) -> None:
        catalog.on_llmdeployment(kind, obj)
        if gateway is not None:
            prices_of(gateway, kind, obj)
        update()

    def cluster_scoped(resource: tuple[str, str], take: Handler) -> Handler:
        """The gateway's watch of a cluster-scoped kind: listed once its first SYNC came."""

        def handler(kind: str, obj: dict[str, Any]) -> None:
            take(kind, obj)
            if kind == "SYNC":
                catalog.listed(resource[1])
            update()

        return handler

    def on_endpoint_slice(kind: str, obj: dict[str, object]) -> None:
        catalog.on_endpoint_slice(kind, obj)
        update()

    def problem_of(resource: tuple[str, str], namespace: str | None) -> Problem:
        def problem(message: str | None) -> None:
            catalog.problem(list_key(resource[1], namespace), message)
            update()

        return problem

    update()

    async def run(_app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:

            async def waker(backend: Backend) -> str:
                return await wake(
                    session, api, backend.namespace, backend.name, backend.wake.workload
                )

            router.waker = waker

            def watch(
                resource: tuple[str, str], namespace: str | None, handler: Handler
            ) -> asyncio.Task[None]:
                key = list_key(resource[1], namespace)
                return asyncio.create_task(
                    list_and_watch(
                        session,
                        api,
                        resource,
                        namespace,
                        handler,
                        problem=problem_of(resource, namespace),
                        contact=_contact(catalog, key),
                        failure=_failure(catalog, key),
                        watch_timeout=watch_timeout,
                    )
                )

            scopes: tuple[str | None, ...] = namespaces or (None,)
            watches = ((LLMDEPLOYMENTS, on_llmdeployment), (ENDPOINT_SLICES, on_endpoint_slice))
            tasks = [
                watch(resource, namespace, handler)
                for namespace in scopes
                for resource, handler in watches
            ]
            if gateway is not None:
                # Tenants are cluster-scoped: one watch, and their status written back.
                for resource, take in (
                    (LLMTENANTS, gateway.on_tenant),
                    (LLMPRIORITYCLASSES, gateway.on_priority_class),
                ):
                    tasks.append(watch(resource, None, cluster_scoped(resource, take)))
                tasks.append(asyncio.create_task(report_tenants(session, api, router, gateway)))
                if external_namespace:
                    tasks += _watch_externals(session, api, router, gateway, external_namespace)
            yield
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    app.cleanup_ctx.append(run)


def _watch_externals(
    session: aiohttp.ClientSession,
    api: ApiServer,
    router: Router,
    gateway: Gateway,
    namespace: str,
) -> list[asyncio.Task[None]]:
    """Watch the LLMExternalModels of `namespace`; read their keys and write their status."""
    changed = asyncio.Event()
    seen: dict[str, list[dict[str, Any]]] = {}

    def handler(kind: str, obj: dict[str, Any]) -> None:
        externals_of(router, gateway, kind, obj, seen)
        changed.set()

    def problem(message: str | None) -> None:
        if message is not None:
            log.warning("no fallback to external models: %s", message)

    watch = list_and_watch(session, api, LLMEXTERNALMODELS, namespace, handler, problem=problem)
    keys = keep_external_keys(session, api, router, namespace, changed=changed, seen=seen)
    return [asyncio.create_task(watch), asyncio.create_task(keys)]


def externals_of(
    router: Router,
    gateway: Gateway,
    kind: str,
    obj: dict[str, Any],
    seen: dict[str, list[dict[str, Any]]],
) -> None:
    """A watch event of LLMExternalModels: the router's externals and their prices follow;
    `seen` keeps each object's status conditions (their transition times carry over)."""
    items = obj.get("items") or [] if kind == "SYNC" else [obj]
    if kind == "SYNC":
        # A relist: the ones no longer listed go; the others keep the key read for them
        # (`put` drops it only when their Secret changed).
        listed = {str((item.get("metadata") or {}).get("name", "")) for item in items}
        for gone in [m for n, m in router.externals.models.items() if n not in listed]:
            gateway.prices.pop(gone.key, None)
            router.externals.remove(gone.name)
            seen.pop(gone.name, None)
    for item in items:
        name = str((item.get("metadata") or {}).get("name", ""))
        old = router.externals.models.get(name)
        if old is not None:
            gateway.prices.pop(old.key, None)
        if kind == "DELETED":
            router.externals.remove(name)
            seen.pop(name, None)
            continue
        try:
            external = parse_external_model(item)
        except ExternalModelError as exc:
            log.error("%s; fallbacks naming it are skipped until it is fixed", exc)
            router.externals.remove(name)
            continue
        router.externals.put(external)
        gateway.set_price(external.key, external.pricing)
        seen[name] = list((item.get("status") or {}).get("conditions") or [])


EXTERNAL_KEY_SECONDS = 60.0
"""How often the external models' Secrets are read again (a rotated key is taken within it)."""


async def keep_external_keys(
    session: aiohttp.ClientSession,
    api: ApiServer,
    router: Router,
    namespace: str,
    *,
    changed: asyncio.Event,
    seen: dict[str, list[dict[str, Any]]],
) -> None:
    """Forever: read each external model's key from its Secret (at once when the models
    change, else every `EXTERNAL_KEY_SECONDS`), and write each one's `Ready` condition when it
    differs from the object's (as last watched, or written here). A failed read keeps the key
    read before it."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), EXTERNAL_KEY_SECONDS)
        changed.clear()
        externals = router.externals
        for name, external in list(externals.models.items()):
            ref = external.secret
            if ref is None:
                continue
            try:
                data = await read_secret(session, api, namespace, ref.name)
            except Exception as exc:
                log.warning("Secret %s/%s not read: %s", namespace, ref.name, exc)
                continue
            if isinstance(data, int):
                externals.key_read(name, None, secret_problem(ref, namespace, data))
            elif not data.get(ref.key):
                externals.key_read(name, None, key_missing(ref, namespace))
            else:
                externals.key_read(name, data[ref.key].strip(), None)
        for name in list(externals.models):
            ready, reason, message = externals.readiness(name)
            current = seen.get(name, [])
            if _has_condition(current, (READY, ready, reason, message)):
                continue
            patch = status_patch([(READY, ready, reason, message)], current, None, time.time())
            try:
                await patch_status(
                    session, api, name, patch, resource=LLMEXTERNALMODELS, namespace=namespace
                )
            except Exception as exc:
                log.warning("status of LLMExternalModel %s not written: %s", name, exc)
                continue
            seen[name] = patch["status"]["conditions"]


def _has_condition(conditions: list[dict[str, Any]], wanted: tuple[str, bool, str, str]) -> bool:
    """Whether `conditions` (a status's) hold this one already: a recreated object (no status)
    or one whose condition changed gets it written."""
    kind, holds, reason, message = wanted
    return any(
        c.get("type") == kind
        and c.get("status") == ("True" if holds else "False")
        and c.get("reason") == reason
        and c.get("message") == message[:1024]
        for c in conditions
    )


# --- The gateway ----------------------------------------------------------------------------------


def _gateway_arguments(serving: argparse.ArgumentParser) -> None:
    group = serving.add_argument_group("gateway (API keys, limits, metering: docs/gateway.md)")
    group.add_argument(
        "--gateway",
        action="store_true",
        help="require a tenant's API key on every request (LLMTenant objects, watched) and "
        "hold each tenant to its limits",
    )
    group.add_argument(
        "--static-tenants",
        metavar="FILE",
        help="with --static: the tenants from this YAML file (LLMTenant objects, several per "
        "file); turns the gateway on",
    )
    group.add_argument(
        "--store",
        metavar="URL",
        default="",
        help="the shared store's URL (redis://host:6379/0): limits shared by every router "
        "replica; unset: each router counts alone",
    )
    group.add_argument(
        "--store-password-file",
        metavar="FILE",
        help="the store's password, read from this file (a mounted Secret)",
    )
    group.add_argument(
        "--store-timeout-ms",
        type=float,
        default=DEFAULT_STORE_TIMEOUT_MS,
        help="a store call slower than this counts as a failure",
    )
    group.add_argument(
        "--store-on-error",
        choices=("FailOpen", "FailClosed"),
        default="FailOpen",
        help="while the store is down: admit by this replica's share of each limit "
        "(FailOpen), or refuse 503 (FailClosed)",
    )
    group.add_argument(
        "--external-namespace",
        default=os.environ.get("POD_NAMESPACE", ""),
        help="the router's own namespace: the LLMExternalModels there (and the Secrets with "
        "their keys) are the APIs outside the cluster a model may fall back to; empty: none "
        "[default: $POD_NAMESPACE]",
    )
    group.add_argument(
        "--gpu-hour-price",
        type=_gpu_hour_price,
        default=None,
        metavar="AMOUNT",
        help="what one GPU costs per hour (a decimal, in --gpu-hour-currency): reported per "
        "routed model as llmop_gateway_gpu_cost_per_hour, so a dashboard shows what a token "
        "costs in GPU time, and a model without spec.router.pricing is charged the GPU time "
        "its requests take at its status.plan; unset: neither",
    )
    group.add_argument(
        "--gpu-hour-currency",
        default="USD",
        help="the currency of --gpu-hour-price",
    )
    group.add_argument(
        "--engine-readings-seconds",
        type=float,
        default=POLL_SECONDS,
        metavar="SECONDS",
        help="how often the engines this router has requests at are asked for their running "
        "and waiting counts (their /metrics): an engine that queues requests gets fewer "
        "than the plan's slots until it has room, so the queue stays in the router, where "
        "priority holds; 0: the plan's slots only",
    )
    group.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="router replicas sharing the store and the engines: while the store is down each "
        "admits 1/N of a limit, and each sends a saturated model 1/N of its slots",
    )


def _gpu_hour_price(text: str) -> Decimal:
    try:
        price = Decimal(text)
    except InvalidOperation:
        price = Decimal("NaN")
    if not price.is_finite() or price < 0 or price > MAX_GPU_HOUR_PRICE:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a price: a decimal from 0 to {MAX_GPU_HOUR_PRICE}, e.g. 2.49"
        )
    return price


MAX_GPU_HOUR_PRICE = Decimal(1_000_000)


DEFAULT_STORE_TIMEOUT_MS = 250.0
"""Redis answers in well under a millisecond, but the time counts the router's own event-loop
lag too: on a busy router (measured: a 55 ms mean admission at 200 streams on 2 loaded cores) a
shorter bound fails healthy calls and opens the breaker, and a tenant's limit then falls to the
local share."""


def _gateway(args: argparse.Namespace, router: Router) -> Gateway:
    metrics = GatewayMetrics(router.metrics.registry)
    store: Store
    if args.store:
        password = None
        if args.store_password_file:
            with open(args.store_password_file, encoding="utf-8") as handle:
                password = handle.read().strip() or None
        timeout = args.store_timeout_ms / 1000
        store = Guarded(
            Redis(args.store, timeout=timeout, password=password),
            fail_open=args.store_on_error == "FailOpen",
            replicas=args.replicas,
            timeout=timeout,
            health=store_health(metrics),
        )
    else:
        store = Local()
    router.sharing.replicas = max(1, args.replicas)
    if args.engine_readings_seconds > 0:
        router.sharing.readings = Readings(max(0.1, args.engine_readings_seconds))
    if isinstance(store, Guarded) and args.replicas > 1:
        router.sharing.bus = Bus(store.shared)
    if args.gpu_hour_price is not None:
        table = router.table
        router.metrics.registry.register(
            GpuCost(
                args.gpu_hour_price,
                args.gpu_hour_currency,
                lambda: [(m, b.gpus * len(b.ring.endpoints)) for m, b in table.backends.items()],
            )
        )
    gateway = Gateway(store, metrics)
    if args.gpu_hour_price is not None:
        gateway.gpu_hour = GpuHourPrice(args.gpu_hour_price, args.gpu_hour_currency)
    return gateway


TENANT_STATUS_SECONDS = 30.0
"""How often each router pod writes the tenants' status: conditions and the month's usage."""


async def report_tenants(
    session: aiohttp.ClientSession, api: ApiServer, router: Router, gateway: Gateway
) -> None:
    """Write each LLMTenant's status, forever (a patch only when it changed)."""
    written: dict[str, str] = {}
    while True:
        await asyncio.sleep(TENANT_STATUS_SECONDS if written else 2.0)
        patches = await gateway.tenant_statuses(sorted(router.table.backends), time.time())
        for name, patch in patches.items():
            text = json.dumps(patch, sort_keys=True)
            if written.get(name) == text:
                continue
            try:
                await patch_status(session, api, name, patch)
            except Exception as exc:
                log.warning("status of LLMTenant %s not written: %s", name, exc)
                continue
            written[name] = text


def static_tenants(path: str) -> tuple[list[Tenant], list[PriorityClass]]:
    """`LLMTenant` and `LLMPriorityClass` objects from a YAML file (the same shape as the CRs;
    an object without `kind` is a tenant)."""
    import yaml

    with open(path, encoding="utf-8") as handle:
        documents = [d for d in yaml.safe_load_all(handle) if d]
    tenants = [
        parse_tenant(d)
        for d in documents
        if d.get("kind", contract.TENANT_KIND) == contract.TENANT_KIND
    ]
    classes = [
        parse_priority_class(d) for d in documents if d.get("kind") == contract.PRIORITY_CLASS_KIND
    ]
    return tenants, classes


def static_entries(path: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Each CR of a static table: its entry, whose `pricing` is as `spec.router.pricing`,
    `gpus` as `spec.resources.gpus` and `plan` as `status.plan` (for the GPU-time price)."""
    with open(path, encoding="utf-8") as handle:
        document: Any = json.load(handle)
    return {
        (entry["namespace"], entry["name"]): entry for entry in document.get("models", {}).values()
    }


def prices_of(gateway: Gateway, kind: str, obj: dict[str, Any]) -> None:
    """Keep each LLMDeployment's `spec.router.pricing`; a relist of a scope (a namespace, or
    all of them) replaces that scope's LLMDeployment prices, so a CR deleted during a watch gap
    loses its. The external models' prices (`ExternalModel.key`: a `/` in the name, which no
    LLMDeployment's has) are `externals_of`'s and stay."""
    items = obj.get("items") or [] if kind == "SYNC" else [obj]
    if kind == "SYNC":
        scope = obj.get("namespace")
        for cr in [
            cr for cr in gateway.prices if (scope is None or cr[0] == scope) and "/" not in cr[1]
        ]:
            gateway.prices.pop(cr)
    for item in items:
        meta = item.get("metadata") or {}
        cr = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if kind == "DELETED":
            gateway.prices.pop(cr, None)
            continue
        spec = item.get("spec") or {}
        router_spec = spec.get(contract.Spec.ROUTER) or {}
        gateway.set_price(
            cr,
            router_spec.get(contract.Pricing.PRICING),
            gpus=gpus_of(spec),
            status=item.get("status"),
        )


if __name__ == "__main__":
    main()
