"""The operator's Kubernetes API gateway: the only module that speaks HTTP to the API server.

Plain dicts in, plain dicts out, over one urllib3 connection pool (thread-safe: the handlers run
in threads) opened with `llmop.credentials`. Server-side apply (`application/apply-patch+yaml`,
an explicit field manager, `force=true`), delete, read, list, `/status` merge patches and Events.
Status-code semantics are decided here once: 404 on read/delete/status means "gone"; 400/422 on
apply means the API server rejected our object (it will not get better by retrying); 409 on an
apply of a `new` object means an object of that name exists already (`ExistsError`); 403
"namespace is being terminated" means the whole namespace is going away; 401 loads the
credentials again once (a rotated token, an expired plugin token); everything else is a transient
`KubeError` the caller may retry.

`Kube.fence` cuts a client off the API server for good (a leader that lost its Lease): the
requests in flight are aborted on their sockets and every later one fails before it is sent.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import socket
import ssl
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

from llmop import credentials, kinds
from llmop.credentials import Credentials, CredentialsError

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = "llmop"

log = logging.getLogger("llmop.kube")


class KubeError(Exception):
    """An API call failed in a way that may pass (5xx, 409, 429, network); retry later."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class TerminatingError(KubeError):
    """The namespace is being deleted: nothing new may be created there, and nothing should."""


class RejectedError(KubeError):
    """The API server refused the object itself (400/422): retrying the same object is futile."""


class ExistsError(KubeError):
    """An apply with `new` found an object of that name already there (409): nothing was
    written to it."""


NEW_ONLY_RESOURCE_VERSION = "18446744073709551615"
"""The resourceVersion an apply with `new` carries. On an existing object the API server checks
it as an optimistic lock, and no object has it (the largest uint64, far beyond any revision), so
it answers 409 and writes nothing; creating, the API server ignores it (the apply creates as
usual: one request, an Apply entry in managedFields). A create-only server-side apply, proven
against the real API server in tests/integration/test_operator_takeover.py."""


def _path(
    api_version: str,
    kind: str,
    namespace: str | None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    plural = kinds.plural(kind)  # from the registry: no discovery round trips
    parts = [base]
    if namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


def _message(status: int, data: bytes) -> str:
    try:
        body = json.loads(data)
    except ValueError:
        return f"HTTP {status}: {data[:500]!r}"
    if isinstance(body, dict) and body.get("message"):
        return f"HTTP {status}: {body['message']}"
    return f"HTTP {status}"


TOKEN_FILE_RELOAD_SECONDS = 60.0
"""How long a token read from a file is used before it is read again (client-go: one minute)."""
RETRIES = urllib3.Retry(total=3, redirect=0, raise_on_status=False)
"""Connection failures (a kept-alive connection the API server closed) are tried again; urllib3
retries reads only for idempotent methods."""
NO_RETRIES = urllib3.Retry(total=0, redirect=0, raise_on_status=False)
"""For a client whose every request must end within its timeout (the leader Lease's): with
RETRIES a GET or PUT to a hung API server times out four times over."""


FENCED = "not sent: this client is fenced off the API server (its leadership term ended)"


class _Fence:
    """The connections a client opened, so that `Kube.fence` can shut them, and whether it did.
    A connection registers once connected; one that connects after the fence is closed at once
    (urllib3 then retries on its pool, which the fence closed too: the request fails)."""

    def __init__(self) -> None:
        self.cut = False
        self._lock = threading.Lock()
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()

    def track(self, connection: Any) -> bool:
        """Register a connection that just connected; False when the fence is already cut."""
        with self._lock:
            if not self.cut:
                self._live.add(connection)
            return not self.cut

    def close(self) -> None:
        """Cut: shut every socket this client opened, whichever thread waits on it."""
        with self._lock:
            self.cut = True
            live = list(self._live)
        for connection in live:
            sock = getattr(connection, "sock", None)
            if isinstance(sock, socket.socket):
                # The plain socket's shutdown, also under TLS: ssl.SSLSocket.shutdown would
                # drop the TLS state under a thread still reading through it.
                with contextlib.suppress(OSError):  # closed meanwhile
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _fenced_connections(base: type[Any], fence: _Fence) -> type[Any]:
    """`base` (urllib3's connection class of a pool), registering each connection with `fence`."""

    def connect(self: Any) -> None:
        base.connect(self)
        if not fence.track(self):
            self.close()
            raise ConnectionAbortedError(FENCED)

    return type(f"Fenced{base.__name__}", (base,), {"connect": connect})


@dataclass(frozen=True)
class _Session:
    """A connection pool and the headers that authenticate on it."""

    pool: urllib3.HTTPConnectionPool
    headers: Mapping[str, str]
    credentials: Credentials
    token_read_at: float
    prefix: str
    """The server URL's own path (an API proxy's, e.g. `/k8s/clusters/c-1`), or ""."""

    @classmethod
    def open(
        cls, pool: urllib3.HTTPConnectionPool, headers: Mapping[str, str], creds: Credentials
    ) -> _Session:
        prefix = (urllib3.util.parse_url(creds.server).path or "").rstrip("/")
        return cls(pool, headers, creds, time.monotonic(), prefix)


class Kube:
    """A thread-safe gateway over one connection pool to the API server."""

    def __init__(
        self,
        creds: Credentials,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        pool_size: int = 16,
        timeout: float = 30.0,
        retry: bool = True,
    ) -> None:
        """`kubeconfig`: where renewed credentials come from (None: where `load` finds them).
        `retry`: try a request again on a connection failure (False: each request takes at most
        `timeout`)."""
        self._kubeconfig = kubeconfig
        self._retries = RETRIES if retry else NO_RETRIES
        self._pool_size = pool_size
        self._timeout = urllib3.Timeout(total=timeout)
        self._lock = threading.Lock()
        self._fence = _Fence()
        try:
            pool, headers = self._pool(creds), _headers(creds)
        except CredentialsError as error:
            raise KubeError(str(error)) from error
        self._session = _Session.open(pool, headers, creds)

    @classmethod
    def connect(
        cls,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        pool_size: int = 16,
        timeout: float = 30.0,
        retry: bool = True,
    ) -> Kube:
        """`kubeconfig`'s current context; by default in-cluster credentials when running in a
        pod, else `KUBECONFIG` / ~/.kube/config (`llmop.credentials.load`)."""
        try:
            creds = credentials.load(kubeconfig)
        except CredentialsError as error:
            raise KubeError(str(error)) from error
        # Handlers run in a thread pool; a smaller connection pool would serialize them.
        return cls(creds, kubeconfig=kubeconfig, pool_size=pool_size, timeout=timeout, retry=retry)

    def close(self) -> None:
        """Release the connection pool."""
        self._session.pool.close()

    def fence(self) -> None:
        """Cut this client off the API server for good: the requests in flight fail at once on
        their shut sockets, and every later one fails without being sent (a `KubeError`). For a
        leader that lost its Lease: nothing its threads still run may write any more."""
        self._fence.close()
        with self._lock:
            session = self._session
        session.pool.close()

    @property
    def fenced(self) -> bool:
        return self._fence.cut

    def _pool(self, creds: Credentials) -> urllib3.HTTPConnectionPool:
        # One host: a connection pool of its own, without a PoolManager's per-request URL
        # parsing and pool lookup (2 % of the operator's CPU at a 1,000-CR burst).
        tls: dict[str, Any] = {}
        if creds.server.startswith("https:"):
            tls["ssl_context"] = _ssl_context(creds)
            if creds.tls_server_name:
                tls["server_hostname"] = creds.tls_server_name
            if creds.insecure:
                tls.update(cert_reqs="CERT_NONE", assert_hostname=False)
                # Said once here, not by urllib3 on every request.
                log.warning(
                    "not verifying %s's certificate (insecure-skip-tls-verify)", creds.server
                )
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        pool = urllib3.connection_from_url(
            creds.server,
            maxsize=self._pool_size,
            retries=self._retries,
            timeout=self._timeout,
            **tls,
        )
        pool.ConnectionCls = _fenced_connections(pool.ConnectionCls, self._fence)
        return pool

    def _current(self, *, refused: bool = False) -> _Session:
        """The session to use: a token file read again after a minute; the credentials loaded
        again when they expired or (`refused`) the API server answered 401 to them."""
        session = self._session
        creds = session.credentials
        expired = refused or creds.expired(datetime.now(UTC))
        if not expired and (
            creds.token_file is None
            or time.monotonic() - session.token_read_at < TOKEN_FILE_RELOAD_SECONDS
        ):
            return session
        with self._lock:
            if self._session is not session:  # another thread renewed it meanwhile
                return self._session
            try:
                if expired:
                    creds = credentials.load(self._kubeconfig)
                headers = _headers(creds)
                pool = session.pool
                if _tls_material(creds) != _tls_material(session.credentials):
                    pool = self._pool(creds)
            except CredentialsError as error:
                raise KubeError(f"renewing the credentials: {error}") from error
            self._session = _Session.open(pool, headers, creds)
        if pool is not session.pool:
            session.pool.close()
        return self._session

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        parse: bool = True,
    ) -> tuple[int, Any]:
        if self._fence.cut:
            raise KubeError(f"{method} {path}: {FENCED}")
        url_path = f"{path}?{urlencode(query)}" if query else path
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        session = self._current()
        for attempt in (1, 2):
            headers = dict(session.headers)
            if content_type is not None:
                headers["Content-Type"] = content_type
            try:
                response = session.pool.urlopen(
                    method,
                    session.prefix + url_path,
                    body=payload,
                    headers=headers,
                    retries=self._retries,
                    timeout=self._timeout,
                    redirect=False,
                )
            except (urllib3.exceptions.HTTPError, OSError) as error:
                raise KubeError(f"{method} {path}: {error}") from error
            status, data = int(response.status), response.data
            if status != 401 or attempt == 2 or not session.credentials.renewable:
                break
            session = self._current(refused=True)
        if 200 <= status < 300:
            # Decoding a whole object costs more CPU than the request; skip it when unused.
            return status, json.loads(data) if data and parse else None
        return status, data

    def _raise(self, method: str, path: str, status: int, data: Any) -> None:
        message = f"{method} {path}: {_message(status, data)}"
        # A field the API server cannot even decode (a malformed quantity) comes back as 500
        # "failed to convert ... to proper version", not 422: equally hopeless to retry.
        if status in (400, 422) or (status == 500 and "to proper version" in message):
            raise RejectedError(message, status)
        if status == 403 and "because it is being terminated" in message:
            raise TerminatingError(message, status)
        raise KubeError(message, status)

    def read(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        path = _path(api_version, kind, namespace, name)
        status, data = self._request("GET", path)
        if status == 404:
            return None
        if status >= 300:
            self._raise("GET", path, status, data)
        result: dict[str, Any] = data
        return result

    def serves(self, api_version: str, plural: str) -> bool:
        """Whether the API server serves `plural` in `api_version` (a group's discovery document,
        which every authenticated client may read: no RBAC on CRDs needed)."""
        path = f"/apis/{api_version}"
        status, data = self._request("GET", path)
        if status == 404:
            return False
        if status >= 300:
            self._raise("GET", path, status, data)
        return any(r.get("name") == plural for r in (data or {}).get("resources") or [])

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """All objects of a kind (in one namespace, or everywhere), following continue tokens."""
        path = _path(api_version, kind, namespace)
        items: list[dict[str, Any]] = []
        query: dict[str, str] = {"limit": "500"}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        while True:
            status, data = self._request("GET", path, query=query)
            if status == 404:
                return items
            if status >= 300:
                self._raise("GET", path, status, data)
            items.extend(data.get("items") or [])
            token = (data.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = token

    def apply(
        self,
        manifest: Mapping[str, Any],
        *,
        field_manager: str,
        force: bool = True,
        want_result: bool = True,
        new: bool = False,
    ) -> dict[str, Any]:
        """Server-side apply `manifest` as `field_manager`; returns the live object (an empty
        dict when `want_result` is false: the caller reads children from its watch caches).
        `new`: only create it — an `ExistsError` when an object of that name exists, which is
        left untouched (`NEW_ONLY_RESOURCE_VERSION` says how)."""
        metadata = manifest["metadata"]
        path = _path(
            manifest["apiVersion"], manifest["kind"], metadata.get("namespace"), metadata["name"]
        )
        query = {"fieldManager": field_manager, "force": "true" if force else "false"}
        body = dict(manifest)
        if new:
            body["metadata"] = {**metadata, "resourceVersion": NEW_ONLY_RESOURCE_VERSION}
        status, data = self._request(
            "PATCH",
            path,
            query=query,
            body=body,
            content_type=APPLY_PATCH,
            parse=want_result,
        )
        if status == 409 and new:
            raise ExistsError(f"APPLY {path}: {_message(status, data)}", status)
        if status >= 300:
            self._raise("APPLY", path, status, data)
        result: dict[str, Any] = data or {}
        return result

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete (background propagation); False when it was already gone."""
        path = _path(api_version, kind, namespace, name)
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        status, data = self._request("DELETE", path, body=body)
        if status == 404:
            return False
        if status >= 300:
            self._raise("DELETE", path, status, data)
        return True

    def patch_status(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        status_patch: Mapping[str, Any],
    ) -> dict[str, Any] | None:
        """Merge-patch `/status`; None when the object is gone."""
        path = _path(api_version, kind, namespace, name, "status")
        body: dict[str, Any] = {"status": dict(status_patch)}
        status, data = self._request("PATCH", path, body=body, content_type=MERGE_PATCH)
        if status == 404:
            return None
        if status >= 300:
            self._raise("PATCH", path, status, data)
        result: dict[str, Any] = data
        return result

    def patch_annotations(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        annotations: Mapping[str, str | None],
    ) -> bool:
        """Merge-patch annotations (None removes one); False when the object is gone."""
        body = {"metadata": {"annotations": dict(annotations)}}
        return self._merge_patch(_path(api_version, kind, namespace, name), body)

    def scale(self, api_version: str, kind: str, namespace: str, name: str, replicas: int) -> bool:
        """Merge-patch the `scale` subresource's spec.replicas (what the HPA writes too, so
        the workload's own field owners are untouched); False when the object is gone."""
        path = _path(api_version, kind, namespace, name, "scale")
        return self._merge_patch(path, {"spec": {"replicas": replicas}})

    def _merge_patch(self, path: str, body: Mapping[str, Any]) -> bool:
        """Merge-patch `path`; False when the object is gone."""
        status, data = self._request(
            "PATCH", path, body=body, content_type=MERGE_PATCH, parse=False
        )
        if status == 404:
            return False
        if status >= 300:
            self._raise("PATCH", path, status, data)
        return True

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """POST a new object; a KubeError with status 409 when it exists already."""
        metadata = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], metadata.get("namespace"))
        status, data = self._request("POST", path, body=dict(manifest))
        if status >= 300:
            self._raise("POST", path, status, data)
        result: dict[str, Any] = data
        return result

    def replace(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the whole object; with metadata.resourceVersion set, a KubeError with status 409
        when the object changed since it was read (optimistic concurrency)."""
        metadata = manifest["metadata"]
        path = _path(
            manifest["apiVersion"], manifest["kind"], metadata.get("namespace"), metadata["name"]
        )
        status, data = self._request("PUT", path, body=dict(manifest))
        if status >= 300:
            self._raise("PUT", path, status, data)
        result: dict[str, Any] = data
        return result

    def create_event(self, event: Mapping[str, Any]) -> None:
        """Post a core/v1 Event; a missing namespace (being deleted) is not an error."""
        path = _path("v1", "Event", event["metadata"]["namespace"])
        status, data = self._request("POST", path, body=dict(event), parse=False)
        if status in (403, 404):
            return
        if status >= 300:
            self._raise("POST", path, status, data)


def _headers(creds: Credentials) -> dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
    token = creds.current_token()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    elif creds.username is not None:
        pair = f"{creds.username}:{creds.password or ''}".encode()
        headers["Authorization"] = f"Basic {base64.b64encode(pair).decode()}"
    return headers


def _tls_material(creds: Credentials) -> tuple[Any, ...]:
    return (
        creds.server,
        creds.ca_file,
        creds.ca_data,
        creds.insecure,
        creds.tls_server_name,
        creds.cert_file,
        creds.key_file,
        creds.cert_data,
        creds.key_data,
    )


def _ssl_context(creds: Credentials) -> ssl.SSLContext:
    """Verify the server against the kubeconfig's CA (the system's when it names none); present
    the client certificate when there is one."""
    try:
        context = ssl.create_default_context(cafile=creds.ca_file, cadata=creds.ca_data)
        if creds.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if creds.cert_file and creds.key_file:
            context.load_cert_chain(creds.cert_file, creds.key_file)
        elif creds.cert_data and creds.key_data:
            _load_cert_chain_data(context, creds.cert_data, creds.key_data)
    except (ssl.SSLError, OSError) as error:
        raise CredentialsError(f"TLS settings for {creds.server}: {error}") from error
    return context


def _load_cert_chain_data(context: ssl.SSLContext, cert: str, key: str) -> None:
    # ssl loads a chain only from files: a private directory, gone once loaded.
    with tempfile.TemporaryDirectory(prefix="llmop-tls-") as directory:
        cert_path, key_path = Path(directory, "tls.crt"), Path(directory, "tls.key")
        for path, text in ((cert_path, cert), (key_path, key)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(text)
        context.load_cert_chain(str(cert_path), str(key_path))
