"""The local metrics pipeline's config (e2e/metrics/metrics_config.py) agrees with the chart.

The chart's PodMonitor is what a real cluster's prometheus-operator turns into scrape jobs; the
local cluster has no operator, so metrics_config.py does that translation. These tests hold the
two together: one job per podMetricsEndpoint with its port, path, interval and relabelings; the
jobs keep exactly the operator's engine pods' two metrics ports (relabeling evaluated here over the
pod the operator renders, in the meta labels kubernetes_sd gives it) and label them with the
LLMDeployment; the adapter config is the chart's ConfigMap, serving the metric the operator's HPA
asks for; and the real promtool accepts the written prometheus.yml.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
from typing import Any

import pytest
import yaml

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render import Children, RenderSettings, render_children
from support.metrics import load_metrics_config, metrics_bin_dir

mc = load_metrics_config()
DEPLOYMENT_META = "__meta_kubernetes_pod_label_serving_llmop_dev_deployment"


def children() -> Children:
    """What the operator renders for an autoscaled LLMDeployment team-a/chat."""
    llmd = LLMDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {
                "model": {"name": "tiny"},
                "autoscaling": {"minReplicas": 1, "maxReplicas": 3},
            },
        }
    )
    return render_children(
        llmd, RenderSettings(vllm_image="e:1", simulator_image="s:1"), load_timeout_seconds=900
    )


def engine_pod() -> tuple[str, dict[str, str], list[dict[str, Any]]]:
    """Name, labels and containers of the pod template the operator renders."""
    template = children().deployment["spec"]["template"]
    return "chat", template["metadata"]["labels"], template["spec"]["containers"]


def sd_targets(labels: dict[str, str], containers: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The targets kubernetes_sd (role: pod) discovers for this pod: one per container port."""
    meta = {"__meta_kubernetes_namespace": "team-a", "__meta_kubernetes_pod_name": "chat-0"}
    meta["__meta_kubernetes_pod_phase"] = "Running"
    for k, v in labels.items():
        s = re.sub(r"[^a-zA-Z0-9_]", "_", k)
        meta[f"__meta_kubernetes_pod_label_{s}"] = v
        meta[f"__meta_kubernetes_pod_labelpresent_{s}"] = "true"
    return [
        {
            **meta,
            "__address__": f"10.244.7.9:{p['containerPort']}",
            "__meta_kubernetes_pod_container_name": c["name"],
            "__meta_kubernetes_pod_container_port_name": p.get("name", ""),
            "job": "x",
        }
        for c in containers
        for p in c.get("ports", [])
    ]


def relabel(target: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus relabeling for the actions the jobs use (keep, drop, replace)."""
    t = dict(target)
    for r in rules:
        value = r.get("separator", ";").join(t.get(s, "") for s in r.get("source_labels", []))
        m = re.fullmatch(r.get("regex", "(.*)"), value)
        action = r.get("action", "replace")
        if action == "keep" and not m:
            return None
        if action == "drop" and m:
            return None
        if action == "replace" and m:
            out = m.expand(r.get("replacement", "$1").replace("$", "\\"))
            if out:
                t[r["target_label"]] = out
            else:
                t.pop(r["target_label"], None)
    return t


def test_one_job_per_podmonitor_endpoint() -> None:
    docs = mc.render()
    pm = mc.one(docs, "PodMonitor", "-engines")
    jobs = pod_jobs(mc.prometheus_config(docs, "/k"))
    endpoints = pm["spec"]["podMetricsEndpoints"]
    # The probe port twice: everything every 15 s, and the HPA's queue depth alone every 5 s.
    assert [(ep["port"], ep["interval"]) for ep in endpoints] == [
        (names.PROBE_PORT_NAME, "15s"),
        (names.API_PORT_NAME, "15s"),
        (names.PROBE_PORT_NAME, "5s"),
    ]
    assert len(jobs) == len(endpoints)
    for job, ep in zip(jobs, endpoints, strict=True):
        assert job["metrics_path"] == ep["path"]
        assert job["scrape_interval"] == ep["interval"]
        assert job["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": "/k"}]
        # The PodMonitor's own relabelings come last, in order, in Prometheus's spelling.
        own = job["relabel_configs"][-len(ep["relabelings"]) :]
        assert own == [prometheus_spelling(r) for r in ep["relabelings"]]
        assert job.get("metric_relabel_configs") == (
            [prometheus_spelling(r) for r in ep["metricRelabelings"]]
            if "metricRelabelings" in ep
            else None
        )


def prometheus_spelling(rule: dict[str, Any]) -> dict[str, Any]:
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in rule.items()}


def series_kept(job: dict[str, Any], name: str) -> bool:
    """Whether `job`'s metric relabelling keeps a scraped series called `name`."""
    return relabel({"__name__": name}, job.get("metric_relabel_configs") or []) is not None


def test_the_queue_depth_has_one_fast_writer() -> None:
    jobs = pod_jobs(mc.prometheus_config(mc.render(), None))
    probe, api, fast = jobs
    assert fast["scrape_interval"] == "5s"
    assert series_kept(fast, names.QUEUE_DEPTH_METRIC)
    assert not series_kept(fast, "llmop_engine_running_requests")
    assert not series_kept(probe, names.QUEUE_DEPTH_METRIC)
    assert series_kept(probe, "llmop_engine_running_requests")
    assert series_kept(api, "vllm:num_requests_waiting")
    # Same pod and port as the probe job: only llmop_scrape tells their targets apart.
    _, labels, containers = engine_pod()
    (slow_target,) = [
        t
        for t in (relabel(t, probe["relabel_configs"]) for t in sd_targets(labels, containers))
        if t is not None
    ]
    (fast_target,) = [
        t
        for t in (relabel(t, fast["relabel_configs"]) for t in sd_targets(labels, containers))
        if t is not None
    ]
    assert {k: v for k, v in fast_target.items() if k != "llmop_scrape"} == slow_target
    assert fast_target["llmop_scrape"] == "queue-depth"


def test_queue_depth_interval_empty_scrapes_it_with_the_rest() -> None:
    values = mc.MONITORING_VALUES | {
        "monitoring": mc.MONITORING_VALUES["monitoring"]
        | {"podMonitor": {"enabled": True, "queueDepthInterval": ""}}
    }
    jobs = pod_jobs(mc.prometheus_config(mc.render(values), None))
    assert [j["scrape_interval"] for j in jobs] == ["15s", "15s"]
    assert all(series_kept(j, names.QUEUE_DEPTH_METRIC) for j in jobs)


def test_jobs_keep_exactly_the_engine_pods_metrics_ports() -> None:
    docs = mc.render()
    jobs = mc.prometheus_config(docs, None)["scrape_configs"]
    name, labels, containers = engine_pod()
    targets = sd_targets(labels, containers)
    ports = {t["__meta_kubernetes_pod_container_port_name"] for t in targets}
    assert {names.PROBE_PORT_NAME, names.API_PORT_NAME} <= ports
    kept = []
    for job in jobs:
        for t in targets:
            out = relabel(t, job["relabel_configs"])
            if out is not None:
                kept.append(out)
    assert sorted(k["endpoint"] for k in kept) == sorted(
        [names.API_PORT_NAME, names.PROBE_PORT_NAME, names.PROBE_PORT_NAME]
    )
    for k in kept:
        assert k["llmdeployment"] == name  # what the alerts, dashboard and adapter group by
        assert k["namespace"] == "team-a"
        assert k["pod"] == "chat-0"
        assert k["job"] == "llmop-system/llmop-engines"
    # A pod without the engine labels (any other workload) is never scraped.
    other = sd_targets({"app": "web"}, containers)
    assert all(relabel(t, j["relabel_configs"]) is None for j in jobs for t in other)
    finished = [dict(t, __meta_kubernetes_pod_phase="Succeeded") for t in targets]
    assert all(relabel(t, j["relabel_configs"]) is None for j in jobs for t in finished)


def test_static_targets_are_what_kubernetes_sd_discovers_with_the_same_jobs() -> None:
    """tests/integration/test_metrics_promql.py scrapes local processes through static targets:
    they must carry the labels kubernetes_sd gives the operator's pod, under the very jobs (and
    relabelling) the PodMonitor implies, only the discovery swapped."""
    docs = mc.render()
    pm = mc.one(docs, "PodMonitor", "-engines")
    _, labels, containers = engine_pod()
    pod = {
        "metadata": {"namespace": "team-a", "name": "chat-0", "labels": labels},
        "spec": {"containers": containers},
    }
    addresses = {names.API_PORT_NAME: "127.0.0.1:1", names.PROBE_PORT_NAME: "127.0.0.1:2"}
    static = mc.kubernetes_sd_pod_targets(pod, addresses)
    discovered = {
        t["__meta_kubernetes_pod_container_port_name"]: t for t in sd_targets(labels, containers)
    }
    assert len(static) == 2
    for target in static:
        port = target["labels"]["__meta_kubernetes_pod_container_port_name"]
        expected = {k: v for k, v in discovered[port].items() if k.startswith("__meta_kubernetes_")}
        got = dict(target["labels"])
        assert got.pop("__meta_kubernetes_pod_container_port_number").isdigit()
        assert got == expected
        assert target["targets"] == [addresses[port]]
    sd_jobs = mc.podmonitor_scrape_configs(pm)
    static_jobs = mc.podmonitor_static_scrape_configs(pm, static)
    for sd_job, static_job in zip(sd_jobs, static_jobs, strict=True):
        assert static_job.pop("static_configs") == static
        sd_job.pop("kubernetes_sd_configs")
        assert static_job == sd_job


def test_adapter_serves_the_metric_the_operators_hpa_scales_on() -> None:
    docs = mc.render()
    config = yaml.safe_load(mc.adapter_config(docs))
    assert (
        mc.adapter_config(docs)
        == mc.one(docs, "ConfigMap", "-prometheus-adapter")["data"]["config.yaml"]
    )
    served = {r["name"]["as"] for r in config["rules"]}
    hpa = children().hpa
    assert hpa is not None
    assert served == {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert served == {names.QUEUE_DEPTH_METRIC}
    # The adapter maps the series' namespace/pod labels, which the scrape jobs set.
    assert config["rules"][0]["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }


@pytest.mark.metrics
def test_written_prometheus_config_passes_promtool(tmp_path: pathlib.Path) -> None:
    promtool = metrics_bin_dir() / "promtool"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    mc.write(tmp_path / "out", str(kubeconfig))
    res = subprocess.run(
        [str(promtool), "check", "config", str(tmp_path / "out" / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


@pytest.mark.parametrize("label", ["service", "llmdeployment"])
def test_deployment_label_follows_the_chart_value(label: str) -> None:
    values = {"monitoring": {**mc.MONITORING_VALUES["monitoring"], "deploymentLabel": label}}
    jobs = pod_jobs(mc.prometheus_config(mc.render(values), None))
    for job in jobs:
        # The LLMDeployment name lands in exactly that label, in every job.
        copies = [r for r in job["relabel_configs"] if r.get("source_labels") == [DEPLOYMENT_META]]
        assert [r["target_label"] for r in copies] == [label]


def pod_jobs(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The engines' PodMonitor jobs of a prometheus.yml."""
    return [j for j in config["scrape_configs"] if j["job_name"].startswith("podMonitor/")]


def test_operator_servicemonitor_scrapes_the_operator_pods_behind_its_metrics_service() -> None:
    docs = mc.render()
    sm = mc.one(docs, "ServiceMonitor")
    service = mc.one(docs, "Service", "-metrics")
    jobs = [
        j
        for j in mc.prometheus_config(docs, "/k")["scrape_configs"]
        if j["job_name"].startswith("serviceMonitor/")
    ]
    assert [j["job_name"] for j in jobs] == [f"serviceMonitor/{mc.NAMESPACE}/{mc.RELEASE}/0"]
    job = jobs[0]
    assert job["kubernetes_sd_configs"] == [
        {"role": "endpointslice", "kubeconfig_file": "/k", "namespaces": {"names": [mc.NAMESPACE]}}
    ]
    assert job["metrics_path"] == sm["spec"]["endpoints"][0]["path"]

    def target(labels: dict[str, str], port: str) -> dict[str, str]:
        t = {
            "__meta_kubernetes_namespace": mc.NAMESPACE,
            "__meta_kubernetes_service_name": service["metadata"]["name"],
            "__meta_kubernetes_pod_name": "llmop-abc",
            "__meta_kubernetes_pod_container_name": "operator",
            "__meta_kubernetes_pod_phase": "Running",
            "__meta_kubernetes_endpointslice_port_name": port,
        }
        for key, value in labels.items():
            t[f"__meta_kubernetes_service_label_{mc._sanitize(key)}"] = value
            t[f"__meta_kubernetes_service_labelpresent_{mc._sanitize(key)}"] = "true"
        return t

    kept = relabel(target(service["metadata"]["labels"], "metrics"), job["relabel_configs"])
    assert kept is not None
    assert kept["job"] == service["metadata"]["name"]
    assert (kept["namespace"], kept["pod"], kept["endpoint"]) == (
        mc.NAMESPACE,
        "llmop-abc",
        "metrics",
    )
    # Another port of the Service, or another Service (the router's, an engine's), is not.
    assert relabel(target(service["metadata"]["labels"], "http"), job["relabel_configs"]) is None
    assert relabel(target({"app": "web"}, "metrics"), job["relabel_configs"]) is None
