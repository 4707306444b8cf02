"""The router's Kubernetes I/O: list and watch LLMDeployments and EndpointSlices over HTTP, and
wake a CR at zero through its workload's scale subresource; with the gateway, the same for its
objects, their status, and the Secrets of external models in the router's own namespace.

A plain list-then-watch loop on aiohttp (the proxy's own event loop: no threads), resuming from
the last resourceVersion, relisting on 410 Gone or a broken stream, with bookmarks so an idle
watch costs one open connection. Any failure, expected or not (an unreadable token file, a
handler's bug), is logged and retried with bounded, jittered exponential back-off: a watch never
stops while the router runs, and each success is reported (`Contact`) so the router can tell a
view that stopped updating. Credentials: in a pod, the ServiceAccount's token and CA; else a
kubeconfig (token, token file or client certificate).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import ssl
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from llmop_router import contract
from llmop_router.hold import PHASE_REQUESTED

log = logging.getLogger("llmop_router.kube")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LLMDEPLOYMENTS = (contract.GROUP_VERSION_PATH, contract.PLURAL)
ENDPOINT_SLICES = ("/apis/discovery.k8s.io/v1", "endpointslices")
LLMTENANTS = (contract.GROUP_VERSION_PATH, contract.TENANT_PLURAL)
LLMPRIORITYCLASSES = (contract.GROUP_VERSION_PATH, contract.PRIORITY_CLASS_PLURAL)
"""Cluster-scoped: the gateway's tenants."""
LLMEXTERNALMODELS = (contract.GROUP_VERSION_PATH, contract.EXTERNAL_MODEL_PLURAL)
"""Namespaced: watched in the router's own namespace only (their Secrets are there)."""
WATCH_TIMEOUT_SECONDS = 300
"""The longest a watch request runs before it is opened again (each opening is a contact)."""
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 10.0
"""Back-off after failures: doubling from the first to the max, each drawn in [½, 1] of it so
router pods cut off together do not come back in step."""
UNAVAILABLE_RETRY_SECONDS = 2.0
"""Between two lists while the API server answers 404 (the CRD is not installed) or 403 (RBAC):
no back-off, so a CRD or a binding that arrives late is noticed within this."""
CHART_CRD_HINT = (
    "install it with the chart (crds.enabled=true) or `kubectl apply --server-side -f crds/` "
    "from the llmop release"
)

Handler = Callable[[str, dict[str, Any]], Awaitable[None] | None]
"""Called with ("SYNC", {"items": [...], "namespace": the listed namespace or None for all})
after each list, then ("ADDED" | "MODIFIED" | "DELETED", object) for each watch event."""
Problem = Callable[[str | None], None]
"""Told why the resource cannot be listed (the CRD not installed, RBAC), and None once it can."""
Contact = Callable[[], None]
"""Told each time the watch hears from the API server: a list, a watch opened, an event, a
bookmark."""
Failure = Callable[[str], None]
"""Told each failure of the list or watch, in words (it is retried)."""


def retry_delay(failures: int, draw: Callable[[], float] = random.random) -> float:
    """Seconds to wait after `failures` failures in a row (1 or more): bounded exponential
    back-off with jitter (`draw` returns a number in [0, 1))."""
    ceiling = min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * (1 << min(max(failures - 1, 0), 16)))
    return ceiling * (0.5 + draw() / 2)


def resource_path(resource: tuple[str, str], namespace: str | None) -> str:
    """The list/watch path of a resource, cluster-wide or in one namespace."""
    group_version, plural = resource
    if namespace is None:
        return f"{group_version}/{plural}"
    return f"{group_version}/namespaces/{namespace}/{plural}"


@dataclass
class ApiServer:
    """Where the API server is and how to authenticate to it."""

    host: str
    ssl_context: ssl.SSLContext | bool
    headers: dict[str, str] = field(default_factory=dict)
    token_file: Path | None = None
    """In a pod: the projected token, re-read per request (it rotates)."""

    @classmethod
    def in_cluster(cls) -> ApiServer:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        return cls(
            f"https://{_bracket(host)}:{port}", context, token_file=SERVICE_ACCOUNT / "token"
        )

    @classmethod
    def from_kubeconfig(cls, path: str) -> ApiServer:
        config: Any = yaml.safe_load(Path(path).read_text())
        context_name = config.get("current-context")
        contexts = {c["name"]: c["context"] for c in config.get("contexts", [])}
        context = contexts.get(context_name) or next(iter(contexts.values()))
        cluster = {c["name"]: c["cluster"] for c in config["clusters"]}[context["cluster"]]
        user = {u["name"]: u["user"] for u in config.get("users", [])}.get(context.get("user"), {})
        ssl_context: ssl.SSLContext | bool = True
        if cluster["server"].startswith("https"):
            ssl_context = ssl.create_default_context()
            ca = _material(cluster, "certificate-authority")
            if ca is not None:
                ssl_context.load_verify_locations(cafile=ca)
            if cluster.get("insecure-skip-tls-verify"):
                ssl_context.check_hostname = False
                ssl_context.verify_mode = ssl.CERT_NONE
            cert, key = _material(user, "client-certificate"), _material(user, "client-key")
            if cert is not None and key is not None:
                ssl_context.load_cert_chain(cert, key)
        headers = {"Authorization": f"Bearer {user['token']}"} if user.get("token") else {}
        # `tokenFile`, re-read per request like a pod's projected token; relative to the file.
        token_file = Path(path).parent / user["tokenFile"] if user.get("tokenFile") else None
        token_file = None if headers else token_file
        return cls(cluster["server"].rstrip("/"), ssl_context, headers, token_file)

    def auth_headers(self) -> dict[str, str]:
        if self.token_file is not None:
            return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}
        return self.headers


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _material(section: dict[str, Any], name: str) -> str | None:
    """A file path for `name` or `name-data` (inline base64, written to a private temp file)."""
    if section.get(name):
        return str(section[name])
    data = section.get(f"{name}-data")
    if not data:
        return None
    handle = tempfile.NamedTemporaryFile(prefix="llmop-router-", delete=False)  # noqa: SIM115
    with handle:
        handle.write(base64.b64decode(data))
    return handle.name


def unavailable(resource: tuple[str, str], namespace: str | None, status: int) -> str:
    """Why the API server refuses to list `resource` (404 or 403), and what to do."""
    group_version, plural = resource
    group = group_version.removeprefix("/apis/").rpartition("/")[0]
    where = f"in namespace {namespace}" if namespace else "in every namespace"
    if status == 404:
        crd = f"{plural}.{group}"
        hint = CHART_CRD_HINT if resource == LLMDEPLOYMENTS else "install its CRD"
        return (
            f"the API server does not serve {plural} ({group_version.removeprefix('/apis/')}): "
            f"the CustomResourceDefinition {crd} is not installed, so nothing can be routed "
            f"(the router is unready until it has listed them once); {hint}"
        )
    return (
        f"forbidden to list {plural} {where} (HTTP {status}): the router's ServiceAccount needs "
        f"get, list and watch on them (the chart's <release>-router ClusterRole, bound "
        "cluster-wide or in each of operator.watchNamespaces; the router is unready until it "
        "has listed them once)"
    )


async def list_and_watch(
    session: aiohttp.ClientSession,
    api: ApiServer,
    resource: tuple[str, str],
    namespace: str | None,
    handler: Handler,
    *,
    problem: Problem | None = None,
    contact: Contact = lambda: None,
    failure: Failure = lambda _message: None,
    watch_timeout: float = WATCH_TIMEOUT_SECONDS,
) -> None:
    """Forever: list the resource (in `namespace`, or everywhere), hand the items over, watch
    from there; relist when the watch breaks. Returns only when cancelled. While the API server
    answers 404 or 403, says why (log, `problem`) once and lists again every
    `UNAVAILABLE_RETRY_SECONDS`; any other failure is logged, told to `failure` and retried
    after `retry_delay`. Each watch request runs at most `watch_timeout` seconds, so a quiet
    but healthy watch still makes contact that often."""
    path = resource_path(resource, namespace)
    failures = 0
    reported: str | None = None
    while True:
        try:
            version = await _list(session, api, path, namespace, handler)
            contact()
            failures = 0
            if reported is not None:
                log.info("listed %s: serving it now", path)
                reported = None
                if problem is not None:
                    problem(None)
            await _watch(
                session, api, path, version, handler, contact=contact, watch_timeout=watch_timeout
            )
        except asyncio.CancelledError:
            raise
        except _GoneError:
            log.info("watch of %s expired; listing again", path)
        except Exception as exc:
            # Whatever it is: a watch that stopped would serve a frozen table for ever.
            if isinstance(exc, aiohttp.ClientResponseError) and exc.status in (403, 404):
                message = unavailable(resource, namespace, exc.status)
                if message != reported:
                    log.error("%s", message)
                    reported = message
                    if problem is not None:
                        problem(message)
                await asyncio.sleep(UNAVAILABLE_RETRY_SECONDS)
                continue
            failures += 1
            delay = retry_delay(failures)
            expected = isinstance(exc, aiohttp.ClientError | TimeoutError | ValueError)
            described = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            failure(described)
            # The traceback of a failure nobody foresaw (an unreadable token, a bug) is what a
            # person needs to fix it; the usual network ones say enough in one line.
            log.warning(
                "list/watch of %s failed (%s); again in %.1f s",
                path,
                described,
                delay,
                exc_info=not expected,
            )
            await asyncio.sleep(delay)


class _GoneError(Exception):
    """The resourceVersion is too old (410): list again."""


async def _list(
    session: aiohttp.ClientSession,
    api: ApiServer,
    path: str,
    namespace: str | None,
    handler: Handler,
) -> str:
    async with session.get(
        api.host + path, headers=api.auth_headers(), ssl=api.ssl_context
    ) as answer:
        answer.raise_for_status()
        body: dict[str, Any] = await answer.json()
    await _call(handler, "SYNC", {"items": body.get("items") or [], "namespace": namespace})
    return str(body.get("metadata", {}).get("resourceVersion", ""))


async def _watch(
    session: aiohttp.ClientSession,
    api: ApiServer,
    path: str,
    version: str,
    handler: Handler,
    *,
    contact: Contact,
    watch_timeout: float,
) -> None:
    seconds = max(1, int(watch_timeout))
    while True:
        params = {
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
        }
        # The API server ends the watch after `seconds`; silence well past that is a dead link.
        timeout = aiohttp.ClientTimeout(total=None, sock_read=seconds + min(30, seconds))
        async with session.get(
            api.host + path,
            params=params,
            headers=api.auth_headers(),
            ssl=api.ssl_context,
            timeout=timeout,
        ) as answer:
            if answer.status == 410:
                raise _GoneError
            answer.raise_for_status()
            contact()
            async for line in lines_of(answer.content.iter_any()):
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _GoneError
                    raise ValueError(f"watch error: {obj.get('message')}")
                contact()
                version = str(obj.get("metadata", {}).get("resourceVersion", version))
                if kind != "BOOKMARK":
                    await _call(handler, str(kind), obj)


async def lines_of(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The non-empty lines of a watch stream, however long: one event is one line, and an
    EndpointSlice of a large fleet exceeds aiohttp's 64 KiB line limit."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


async def _call(handler: Handler, kind: str, obj: dict[str, Any]) -> None:
    result = handler(kind, obj)
    if result is not None:
        await result


async def wake(
    session: aiohttp.ClientSession, api: ApiServer, namespace: str, name: str, resource: str
) -> str:
    """Set the workload's scale to 1 when it is 0, and only then; returns what happened, as
    the phase a held request waits in. The patch carries the resourceVersion read with the
    scale, so a change in between (the operator's, a person's) makes it fail with 409 instead
    of being overwritten. Raises on any other failure (the caller retries)."""
    path = contract.scale_path(resource, namespace, name)
    async with session.get(
        api.host + path, headers=api.auth_headers(), ssl=api.ssl_context
    ) as answer:
        answer.raise_for_status()
        scale: dict[str, Any] = await answer.json()
    # Scale's spec.replicas is omitted at 0 (omitempty).
    replicas = int((scale.get("spec") or {}).get("replicas") or 0)
    if replicas != 0:
        return f"waking: {resource}/{name} already at scale {replicas}, no ready replica yet"
    patch = {
        "metadata": {"resourceVersion": (scale.get("metadata") or {}).get("resourceVersion")},
        "spec": {"replicas": 1},
    }
    headers = {**api.auth_headers(), "Content-Type": "application/merge-patch+json"}
    async with session.patch(
        api.host + path, data=json.dumps(patch), headers=headers, ssl=api.ssl_context
    ) as answer:
        answer.raise_for_status()
    log.info("woke %s/%s: %s scale 0 -> 1", namespace, name, resource)
    return PHASE_REQUESTED


async def read_secret(
    session: aiohttp.ClientSession, api: ApiServer, namespace: str, name: str
) -> dict[str, str] | int:
    """A Secret's data, decoded; or the API's HTTP status when it cannot be read (404, 403).
    Raises on anything else (the caller retries)."""
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    async with session.get(
        api.host + path, headers=api.auth_headers(), ssl=api.ssl_context
    ) as answer:
        if answer.status in (403, 404):
            return answer.status
        answer.raise_for_status()
        secret: dict[str, Any] = await answer.json()
    data = secret.get("data") or {}
    return {
        str(k): base64.b64decode(v).decode(errors="replace")
        for k, v in data.items()
        if isinstance(v, str)
    }


async def patch_status(
    session: aiohttp.ClientSession,
    api: ApiServer,
    name: str,
    patch: dict[str, Any],
    *,
    resource: tuple[str, str] = LLMTENANTS,
    namespace: str | None = None,
) -> None:
    """Merge `patch` into a gateway object's status subresource (an LLMTenant's by default;
    `resource` and `namespace` name another); 404: it was deleted meanwhile."""
    path = f"{resource_path(resource, namespace)}/{name}/status"
    headers = {**api.auth_headers(), "Content-Type": "application/merge-patch+json"}
    async with session.patch(
        api.host + path, data=json.dumps(patch), headers=headers, ssl=api.ssl_context
    ) as answer:
        if answer.status != 404:
            answer.raise_for_status()
