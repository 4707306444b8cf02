"""The router while the API server cannot list LLMDeployments for it: the CRD not installed
(404) or no RBAC (403). Its watch says why once (log, and `/readyz` while it is unready), lists
again every `UNAVAILABLE_RETRY_SECONDS` with no back-off, and serves the resource as soon as it
can. A fake API server on a local socket; tests/integration/test_operator_without_crd.py runs the
router against the real API server with its CRD created late."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmop_router import kube
from llmop_router.app import Router
from llmop_router.cli import watching
from llmop_router.discovery import Catalog
from llmop_router.routes import RouteTable

LIST_PATH = "/apis/serving.llmop.dev/v1alpha1/llmdeployments"
SLICES_PATH = "/apis/discovery.k8s.io/v1/endpointslices"


def llmd(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team", "creationTimestamp": "2026-12-01T00:00Z"},
        "spec": {"model": {"name": "org/model"}},
    }


class FakeApiServer:
    """Answers the LLMDeployment list with `status` until `installed`, then with one CR; every
    watch stays open and quiet."""

    def __init__(self, status: int = 404) -> None:
        self.status = status
        self.installed = False
        self.lists = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(LIST_PATH, self.llmdeployments)
        app.router.add_get(SLICES_PATH, self.endpoint_slices)
        return app

    async def llmdeployments(self, request: web.Request) -> web.StreamResponse:
        if "watch" in request.query:
            return await self._quiet_watch(request)
        self.lists += 1
        if not self.installed:
            return web.json_response({"kind": "Status", "code": self.status}, status=self.status)
        return web.json_response({"items": [llmd("llama")], "metadata": {"resourceVersion": "7"}})

    async def endpoint_slices(self, request: web.Request) -> web.StreamResponse:
        if "watch" in request.query:
            return await self._quiet_watch(request)
        return web.json_response({"items": [], "metadata": {"resourceVersion": "3"}})

    async def _quiet_watch(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await asyncio.sleep(3600)
        return response


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (404, "CustomResourceDefinition llmdeployments.serving.llmop.dev is not installed"),
        (403, "forbidden to list llmdeployments in every namespace (HTTP 403)"),
    ],
)
def test_the_watch_says_why_once_and_lists_again_until_it_can(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, status: int, says: str
) -> None:
    monkeypatch.setattr(kube, "UNAVAILABLE_RETRY_SECONDS", 0.02)
    fake = FakeApiServer(status)
    told: list[str | None] = []
    synced: list[dict[str, Any]] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        if kind == "SYNC":
            synced.append(obj)

    async def scenario() -> None:
        async with TestServer(fake.app()) as server, aiohttp.ClientSession() as session:
            api = kube.ApiServer(str(server.make_url("")).rstrip("/"), False)
            task = asyncio.create_task(
                kube.list_and_watch(
                    session, api, kube.LLMDEPLOYMENTS, None, handler, problem=told.append
                )
            )
            while fake.lists < 5:
                await asyncio.sleep(0.01)
            assert synced == []
            assert len(told) == 1, "said once, not at every list"
            fake.installed = True
            while not synced:
                await asyncio.sleep(0.01)
            assert told[-1] is None, "and taken back once it lists"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    with caplog.at_level(logging.INFO, logger="llmop_router.kube"):
        asyncio.run(scenario())
    assert says in str(told[0])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [told[0]]
    if status == 404:
        assert "crds.enabled=true" in str(told[0])
        assert "kubectl apply --server-side -f crds/" in str(told[0])
    assert [item["metadata"]["name"] for item in synced[0]["items"]] == ["llama"]
    assert f"listed {LIST_PATH}: serving it now" in caplog.text


def test_readyz_says_what_it_waits_for_then_turns_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router as `serve --kubeconfig` wires it: unready with the reason in `/readyz`, Ready
    once the CRD is served, with no restart."""
    monkeypatch.setattr(kube, "UNAVAILABLE_RETRY_SECONDS", 0.02)
    fake = FakeApiServer(404)

    async def readyz(client: TestClient[Any, Any]) -> tuple[int, dict[str, Any]]:
        async with client.get("/readyz") as answer:
            return answer.status, json.loads(await answer.text())

    async def scenario() -> None:
        async with TestServer(fake.app()) as api_server:
            router = Router(RouteTable())
            api = kube.ApiServer(str(api_server.make_url("")).rstrip("/"), False)
            router.app_hooks.append(lambda app: watching(app, router, api, ()))
            async with TestClient(TestServer(router.app())) as client:
                while fake.lists < 2:
                    await asyncio.sleep(0.01)
                status, body = await readyz(client)
                assert status == 503
                assert body["ok"] is False
                (reason,) = body["waiting"]
                assert "llmdeployments.serving.llmop.dev is not installed" in reason
                fake.installed = True
                for _ in range(200):
                    status, body = await readyz(client)
                    if status == 200:
                        break
                    await asyncio.sleep(0.01)
                assert (status, body) == (200, {"ok": True})
                assert router.table.models() == ["llama"]

    asyncio.run(scenario())


def test_the_catalog_names_each_list_it_waits_for() -> None:
    catalog = Catalog(RouteTable(), namespaces=("a", "b"))
    assert catalog.waiting() == [
        "listing llmdeployments/a",
        "listing llmdeployments/b",
        "listing endpointslices/a",
        "listing endpointslices/b",
    ]
    catalog.problem("llmdeployments/a", "no CRD")
    catalog.on_llmdeployment("SYNC", {"items": [], "namespace": "b"})
    catalog.on_endpoint_slice("SYNC", {"items": [], "namespace": "a"})
    catalog.on_endpoint_slice("SYNC", {"items": [], "namespace": "b"})
    assert catalog.waiting() == ["no CRD"]
    assert not catalog.ready
    catalog.problem("llmdeployments/a", None)
    catalog.on_llmdeployment("SYNC", {"items": [], "namespace": "a"})
    assert catalog.waiting() == []
    assert catalog.ready
