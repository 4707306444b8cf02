"""The metrics pipeline on the real node: Prometheus scrapes the real engine pods the way the
chart's PodMonitor describes, and prometheus-adapter serves their live queue depth through the
aggregated custom.metrics.k8s.io API, which the operator's HPA reads.

The pipeline is started on the real node's cluster by `cluster.sh metrics`
(e2e/metrics/pipeline.sh, through the `metrics_pipeline` fixture); its config is rendered from the
chart. Proof here: the targets Prometheus discovered are exactly the engine pod's two metrics
ports, labelled with the LLMDeployment; `kubectl get --raw
/apis/custom.metrics.k8s.io/v1beta1/namespaces/NS/pods/*/llmop_engine_queue_depth` answers 0 when
idle, a positive value under a load beyond the engine's batch, and 0 again after it (live values,
not stale); and the HPA reports the metric it reads.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from llmop import names
from support.cluster import wait_until
from support.metrics import hpa_read_the_metric, metric_value
from support.realnode import BackgroundLoad, RealCluster, real_node_spec, service_url

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.cluster,
    pytest.mark.metrics,
    pytest.mark.usefixtures("metrics_pipeline"),
]


def prometheus_url(rc: RealCluster) -> str:
    # cluster.sh keeps the cluster's state beside its kubeconfig; the pipeline its addresses.
    addr = Path(rc.cluster.kubeconfig).parent / "metrics" / "prometheus.addr"
    if not addr.exists():
        pytest.fail(
            f"the metrics pipeline is not running ({addr} missing): `cluster.sh metrics` should "
            "have started it; see the cluster log for 'metrics pipeline'"
        )
    return "http://" + addr.read_text().strip()


def prom_get(url: str, path: str, **params: str) -> Any:
    q = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{q}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def queue_depths(rc: RealCluster, ns: str) -> dict[str, float]:
    """Pod -> value from the custom metrics API; {} while the adapter does not list the metric
    yet (it discovers series names every --metrics-relist-interval, 30 s)."""
    res = rc.kubectl(
        "get",
        "--raw",
        f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{ns}/pods/*/{names.QUEUE_DEPTH_METRIC}",
        check=False,
    )
    if res.returncode != 0:
        assert "could not find the metric" in res.stderr, res.stderr
        return {}
    items = json.loads(res.stdout)["items"]
    return {i["describedObject"]["name"]: metric_value(i["value"]) for i in items}


def test_queue_depth_reaches_the_custom_metrics_api(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    ns, name = e2e_namespace, "scaled"
    spec = real_node_spec(replicas=1)
    del spec["replicas"]
    # maxNumSeqs 2: a load of 10 streams leaves ~8 waiting. maxReplicas 1: the HPA reads the
    # metric but cannot scale, so the one pod's value is all there is to check.
    spec["engine"] = {**spec["engine"], "maxNumSeqs": 2, "args": ["--sim-decode-ms", "40"]}
    spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 1, "targetQueueDepth": 4}
    real_cluster.kit.apply_llmd(ns, name, spec)
    real_cluster.kit.wait_condition(ns, name, "Ready", "True", timeout=180)
    (pod,) = real_cluster.pods(ns, names.selector_string(name))
    pod_name = pod["metadata"]["name"]

    prom = prometheus_url(real_cluster)

    def our_targets() -> list[dict[str, Any]] | None:
        active = prom_get(prom, "/api/v1/targets", state="active")["activeTargets"]
        mine = [t for t in active if t["labels"].get("namespace") == ns]
        return mine if len(mine) == 3 and all(t["health"] == "up" for t in mine) else None

    targets = wait_until(our_targets, timeout=90, interval=2, what="3 healthy engine targets")
    # The probe port twice: everything every 15 s, the HPA's queue depth alone every 5 s.
    assert sorted(
        (t["labels"]["endpoint"], t["labels"].get("llmop_scrape", ""), t["scrapeInterval"])
        for t in targets
    ) == sorted(
        [
            (names.API_PORT_NAME, "", "15s"),
            (names.PROBE_PORT_NAME, "", "15s"),
            (names.PROBE_PORT_NAME, "queue-depth", "5s"),
        ]
    )
    for t in targets:
        assert t["labels"]["pod"] == pod_name
        assert t["labels"]["llmdeployment"] == name
        assert t["scrapeUrl"].startswith(f"http://{pod['status']['podIP']}:")

    idle = wait_until(
        lambda: queue_depths(real_cluster, ns) or None, timeout=120, interval=3, what="metric"
    )
    assert idle == {pod_name: 0.0}

    load = BackgroundLoad(
        service_url(real_cluster.cluster, ns, name),
        name,
        concurrency=10,
        duration=90,
        max_tokens=200,
    ).start()
    try:
        t0 = time.monotonic()
        busy = wait_until(
            lambda: (d := queue_depths(real_cluster, ns)).get(pod_name, 0) > 0 and d,
            timeout=60,
            interval=1,
            what="a positive queue depth under load",
        )
        seen_after = time.monotonic() - t0
        assert busy[pod_name] >= 1, busy

        def hpa_reads_it() -> dict[str, Any] | None:
            hpa = json.loads(
                real_cluster.kubectl("get", "hpa", "-n", ns, name, "-o", "json").stdout
            )
            return hpa if hpa_read_the_metric(hpa) else None

        hpa = wait_until(hpa_reads_it, timeout=60, interval=2, what="HPA currentMetrics")
        conditions = {c["type"]: c for c in hpa["status"]["conditions"]}
        assert conditions["ScalingActive"]["status"] == "True", conditions["ScalingActive"]
        (metric,) = [m["pods"]["metric"]["name"] for m in hpa["status"]["currentMetrics"]]
        assert metric == names.QUEUE_DEPTH_METRIC
    finally:
        result = load.stop()
    assert result.failed == 0, result

    wait_until(
        lambda: queue_depths(real_cluster, ns) == {pod_name: 0.0},
        timeout=90,
        interval=2,
        what="queue depth back to 0 after the load",
    )
    print(f"queue depth visible through custom.metrics.k8s.io {seen_after:.1f}s after the load")
