"""`llmop-router serve`: the router. Its table comes from watching LLMDeployments and their
EndpointSlices (in a pod with its ServiceAccount, else with `--kubeconfig`), or from a static
JSON file (`--static`, development and benchmarks). The OpenAI routes and health listen on
`--port`; metrics, the table and the activity on `--admin-port`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web

from llmop_router import contract, limits
from llmop_router.app import (
    DRAIN_SECONDS,
    SHUTDOWN_DELAY_SECONDS,
    Router,
    serve,
    static_table,
)
from llmop_router.discovery import Catalog, list_key
from llmop_router.kube import (
    ENDPOINT_SLICES,
    LLMDEPLOYMENTS,
    WATCH_TIMEOUT_SECONDS,
    ApiServer,
    Contact,
    Failure,
    Problem,
    list_and_watch,
    wake,
)
from llmop_router.routes import Backend, RouteTable

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
    limits.add_arguments(serving)
    args = parser.parse_args(argv)
    bounds = limits.from_args(args)
    if args.admin_port == args.port and args.port != 0:
        parser.error(
            f"--admin-port {args.admin_port} is --port too: give the admin routes their own "
            f"port (default {contract.DEFAULT_ADMIN_PORT})"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    _event_loop_policy()
    if args.static:
        router = Router(static_table(args.static), limits=bounds)
        router.ready = True
    else:
        api = ApiServer.from_kubeconfig(args.kubeconfig) if args.kubeconfig else None
        router = Router(RouteTable(), limits=bounds)
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


def watching(
    app: web.Application,
    router: Router,
    api: ApiServer,
    namespaces: tuple[str, ...],
    stale_after: float = DEFAULT_STALE_AFTER_SECONDS,
    *,
    serving: tuple[str, ...] = (),
) -> None:
    """Fill the router's table from the watches for as long as the app runs; ready once every
    list arrived (until then `/readyz` says what it waits for: a CRD not installed, say), and
    unready again while a watch has not heard from the API server for `stale_after` seconds
    (0: never). The same credentials wake CRs at zero. Only CRs in `serving` (empty: all) are
    routed."""
    catalog = Catalog(router.table, namespaces, serving)
    watch_timeout = _freshness(router, catalog, stale_after)

    def update() -> None:
        router.ready = catalog.ready
        router.waiting = catalog.waiting()

    def on_llmdeployment(kind: str, obj: dict[str, object]) -> None:
        catalog.on_llmdeployment(kind, obj)
        update()

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
            scopes: tuple[str | None, ...] = namespaces or (None,)
            watches = ((LLMDEPLOYMENTS, on_llmdeployment), (ENDPOINT_SLICES, on_endpoint_slice))
            tasks = [
                asyncio.create_task(
                    list_and_watch(
                        session,
                        api,
                        resource,
                        namespace,
                        handler,
                        problem=problem_of(resource, namespace),
                        contact=_contact(catalog, list_key(resource[1], namespace)),
                        failure=_failure(catalog, list_key(resource[1], namespace)),
                        watch_timeout=watch_timeout,
                    )
                )
                for namespace in scopes
                for resource, handler in watches
            ]
            yield
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    app.cleanup_ctx.append(run)


if __name__ == "__main__":
    main()
