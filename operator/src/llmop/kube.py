"""The operator's Kubernetes API gateway: the only module importing `kubernetes`.

Plain dicts in, plain dicts out. Server-side apply (`application/apply-patch+yaml`, an explicit
field manager, `force=true`), delete, read, list, `/status` merge patches and Events. Status-code
semantics are decided here once: 404 on read/delete/status means "gone"; 400/422 on apply means
the API server rejected our object (it will not get better by retrying); 403 "namespace is being
terminated" means the whole namespace is going away; everything else is a transient `KubeError`
the caller may retry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import client, config

from llmop import kinds

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = "llmop"


class KubeError(Exception):
    """An API call failed in a way that may pass (5xx, 409, 429, network); retry later."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class TerminatingError(KubeError):
    """The namespace is being deleted: nothing new may be created there, and nothing should."""


class RejectedError(KubeError):
    """The API server refused the object itself (400/422): retrying the same object is futile."""


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


class Kube:
    """A thread-safe gateway over one `kubernetes.client.ApiClient` connection pool."""

    def __init__(self, api_client: Any, *, timeout: float = 30.0) -> None:
        self._client = api_client
        self._timeout = timeout

    @classmethod
    def connect(cls, *, pool_size: int = 16, timeout: float = 30.0) -> Kube:
        """In-cluster credentials when running in a pod, else `KUBECONFIG` / ~/.kube/config."""
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            try:
                config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except (config.ConfigException, OSError) as error:
                raise KubeError(
                    f"no cluster credentials (in-cluster or KUBECONFIG): {error}"
                ) from error
        # Handlers run in a thread pool; a smaller connection pool would serialize them.
        configuration.connection_pool_maxsize = pool_size
        api_client = client.ApiClient(configuration)
        api_client.user_agent = USER_AGENT
        return cls(api_client, timeout=timeout)

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()

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
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            method, url, headers, serialized, _ = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(
                method, url, headers, serialized, _request_timeout=self._timeout
            )
            data = response.read()
            status = int(response.status)
        except client.ApiException as error:
            status, data = int(error.status or 0), (error.body or "").encode()
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise KubeError(f"{method} {path}: {error}") from error
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
    ) -> dict[str, Any]:
        """Server-side apply `manifest` as `field_manager`; returns the live object (an empty
        dict when `want_result` is false: the caller reads children from its watch caches)."""
        metadata = manifest["metadata"]
        path = _path(
            manifest["apiVersion"], manifest["kind"], metadata.get("namespace"), metadata["name"]
        )
        query = {"fieldManager": field_manager, "force": "true" if force else "false"}
        status, data = self._request(
            "PATCH",
            path,
            query=query,
            body=dict(manifest),
            content_type=APPLY_PATCH,
            parse=want_result,
        )
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
        status, data = self._request("POST", path, body=dict(event))
        if status in (403, 404):
            return
        if status >= 300:
            self._raise("POST", path, status, data)
