"""The router's view of the cluster knows when it is stale, against the real API server:
`llmop-router serve` authenticating with a token file (as in a pod) through a link the test can
cut (`support.outage`). Its watches make contact at least every third of
`--stale-after-seconds`, so a healthy quiet router stays Ready; a watch that fails is logged and
retried with back-off, whatever the failure: the token file gone (an `OSError` that used to
stop the watch for good) or the API server unreachable. Past the bound the router turns unready
and `/readyz` says which watch and its last error; `llmop_router_watch_age_seconds` on the admin
port shows the age. Once the API server answers again the router is Ready with no restart, and
its table follows the cluster again."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.test_router_watch import apply, llmd, routes
from support.cluster import Cluster, wait_until
from support.outage import CuttableLink, through, upstream_of
from support.router import RouterUrls, get_json, router_process

pytestmark = pytest.mark.cluster

STALE_AFTER = 3
"""Seconds; the watch reopens every second, so a healthy router never comes near it."""
AGE = re.compile(r'^llmop_router_watch_age_seconds\{resource="([a-z]+)"\} ([0-9.e+-]+)$', re.M)


def _token_kubeconfig(cluster: Cluster, namespace: str, directory: Path) -> tuple[Path, Path]:
    """A ServiceAccount that may read what the router reads in `namespace`, and a kubeconfig
    (JSON) naming its token by file, as the router's in-cluster credentials do."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "router", "namespace": namespace},
        "rules": [
            {
                "apiGroups": ["serving.llmop.dev"],
                "resources": ["llmdeployments"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    }
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(role))
    cluster.kubectl("create", "serviceaccount", "router", "-n", namespace)
    cluster.kubectl(
        *("create", "rolebinding", "router", "-n", namespace),
        *("--role=router", f"--serviceaccount={namespace}:router"),
    )
    token_file = directory / "token"
    token_file.write_text(
        cluster.kubectl("create", "token", "router", "-n", namespace).stdout.strip()
    )
    config = json.loads(
        cluster.kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "json").stdout
    )
    config["users"][0]["user"] = {"tokenFile": str(token_file)}
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    return kubeconfig, token_file


@pytest.fixture
def cut_off(
    llmop_crd: Cluster, namespace: str, tmp_path: Path
) -> Iterator[tuple[RouterUrls, CuttableLink, Path]]:
    """The router watching `namespace` through a cuttable link, with a token file."""
    kubeconfig, token_file = _token_kubeconfig(llmop_crd, namespace, tmp_path)
    with CuttableLink(upstream_of(kubeconfig)) as link:
        linked = through(kubeconfig, link, tmp_path / "linked-kubeconfig")
        with router_process(
            linked,
            tmp_path / "router.log",
            ("--namespaces", namespace, "--stale-after-seconds", str(STALE_AFTER)),
        ) as router:
            yield router, link, token_file


def _readyz(router: RouterUrls) -> tuple[int, list[str]]:
    status, body = get_json(f"{router.url}/readyz")
    return status, list((body or {}).get("waiting") or [])


def _ages(router: RouterUrls) -> dict[str, float]:
    with urllib.request.urlopen(f"{router.admin}/metrics", timeout=5) as answer:
        return {m[1]: float(m[2]) for m in AGE.finditer(answer.read().decode())}


def _stale_reason(router: RouterUrls) -> str | None:
    status, waiting = _readyz(router)
    stale = [w for w in waiting if w.startswith("stale: ")]
    return " | ".join(stale) if status == 503 and stale else None


def _routed(cluster: Cluster, router: RouterUrls, namespace: str, name: str) -> None:
    """A CR created now reaches the router's table: its watch follows the cluster."""
    apply(cluster, llmd(namespace, name))
    wait_until(lambda: name in (routes(router) or {}), timeout=20, what=f"{name} routed")


def test_a_watch_that_fails_is_retried_and_a_stale_view_is_unready_until_it_recovers(
    llmop_crd: Cluster, namespace: str, cut_off: tuple[RouterUrls, CuttableLink, Path]
) -> None:
    router, link, token_file = cut_off
    log = token_file.parent / "router.log"
    wait_until(lambda: _readyz(router)[0] == 200, timeout=30, what="the router Ready")
    # Quiet but healthy: Ready for longer than the bound, the ages well under it.
    time.sleep(STALE_AFTER + 1)
    assert _readyz(router) == (200, [])
    ages = _ages(router)
    assert ages.keys() == {"llmdeployments", "endpointslices"}
    assert max(ages.values()) < STALE_AFTER, ages

    # The token file goes (an OSError on each request): retried, and unready past the bound.
    token = token_file.read_text()
    token_file.unlink()
    reason = wait_until(lambda: _stale_reason(router), timeout=20, what="stale: the token gone")
    assert f"more than the {STALE_AFTER} s of --stale-after-seconds" in reason
    assert "FileNotFoundError" in reason
    assert max(_ages(router).values()) > STALE_AFTER
    token_file.write_text(token)
    wait_until(lambda: _readyz(router) == (200, []), timeout=30, what="Ready with the token back")
    _routed(llmop_crd, router, namespace, "after-token")
    text = log.read_text()
    assert "FileNotFoundError" in text
    assert "again in" in text  # retried with back-off, never given up

    # The API server unreachable: the same, and Ready again once it answers.
    link.cut("refuse")
    reason = wait_until(lambda: _stale_reason(router), timeout=20, what="stale: API server down")
    assert "in namespace " + namespace in reason
    link.restore()
    wait_until(lambda: _readyz(router) == (200, []), timeout=30, what="Ready with the link back")
    _routed(llmop_crd, router, namespace, "after-outage")
