#!/usr/bin/env python3
"""Render the local metrics pipeline's configuration from the chart: ONE source, no copies.

The chart (helm/llmop) ships what a real cluster's monitoring stack consumes: a PodMonitor
(prometheus-operator) describing how engine pods are scraped, a PrometheusRule with the alerts and
a ConfigMap with the prometheus-adapter rules behind the HPA's `llmop_engine_queue_depth` metric.
The local cluster has no prometheus-operator, so this renders the chart in-process (the Helm v4
SDK, as tests/chart does) and writes what the operator and the adapter chart would have produced:

  prometheus.yml    one kubernetes_sd (role: pod) scrape job per podMetricsEndpoint, with the
                    relabelings prometheus-operator generates for a PodMonitor (selector keep,
                    port keep, namespace/container/pod/job/endpoint target labels) followed by the
                    PodMonitor's own relabelings; one kubernetes_sd (role: endpointslice) job per
                    endpoint of the operator's ServiceMonitor (what prometheus-operator generates
                    for it); rule_files points at rules.yml
  rules.yml         the PrometheusRule's spec (its `groups`): what Prometheus and promtool load
  adapter.yaml      the adapter ConfigMap's `config.yaml`, verbatim

The operator side of this translation is modelled on prometheus-operator's config generator
(pkg/prometheus/promcfg.go, generatePodMonitorConfig, golden output of its
TestPodMonitorPhaseFilter/TestSettingHonorLabels tests): job name `podMonitor/<ns>/<name>/<i>`,
`__tmp_prometheus_job_name`, keep on `__meta_kubernetes_pod_label_<l>` and `..._labelpresent_<l>`,
keep on `__meta_kubernetes_pod_container_port_name`, drop Failed/Succeeded pods.

Used by e2e/metrics/pipeline.sh (the processes of `make cluster-up`) and by the tests
(tests/chart/test_alert_rules.py, tests/chart/test_metrics_config.py,
tests/e2e/test_metrics_pipeline.py, and tests/integration/test_metrics_promql.py, which scrapes
agent + simulator processes through static targets carrying the labels kubernetes_sd would give
the operator's real pod, so the PodMonitor's relabelling runs unchanged).

Usage: metrics_config.py write --out DIR --kubeconfig FILE [--release NAME --namespace NS]
"""

from __future__ import annotations

import argparse
import pathlib
import re
from typing import Any

import helm_python as helm
import yaml

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "llmop"
RELEASE = "llmop"
NAMESPACE = "llmop-system"

# The monitoring parts of the chart, switched on. Everything else (interval, labels, thresholds)
# stays at the chart's defaults: the local pipeline is what a default install monitors with.
MONITORING_VALUES: dict[str, Any] = {
    "monitoring": {
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "prometheusAdapter": {"enabled": True},
    },
    # The operator's own metrics: scraped where it runs as the chart's pods (release `llmop` in
    # `llmop-system`, what `LLMOP_OPERATOR=pod make dev` installs).
    "metrics": {"serviceMonitor": {"enabled": True}},
}


def render(
    values: dict[str, Any] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """Every object the chart renders for `values` (MONITORING_VALUES when None), as release
    `release` in `namespace`."""
    chart = helm.Chart.load(str(CHART_DIR))
    out = chart.render(
        MONITORING_VALUES if values is None else values, name=release, namespace=namespace
    )
    docs: list[dict[str, Any]] = []
    for name, text in sorted(out.items()):
        if name.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The single rendered object of `kind` (whose name ends with `name_suffix`)."""
    found = [
        d
        for d in docs
        if d.get("kind") == kind and str(d["metadata"]["name"]).endswith(name_suffix)
    ]
    if len(found) != 1:
        raise ValueError(f"expected one {kind}*{name_suffix} in the chart, found {len(found)}")
    return found[0]


def _sanitize(label: str) -> str:
    """Kubernetes label name -> Prometheus meta label suffix (what kubernetes_sd does)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _kubernetes_sd(role: str, monitor: dict[str, Any], kubeconfig: str | None) -> dict[str, Any]:
    """The kubernetes_sd_config of a PodMonitor/ServiceMonitor: `role`, the kubeconfig, and the
    monitor's namespaceSelector (its own namespace unless it says otherwise)."""
    sd: dict[str, Any] = {"role": role}
    if kubeconfig:
        sd["kubeconfig_file"] = kubeconfig
    ns_sel = monitor["spec"].get("namespaceSelector", {})
    if not ns_sel.get("any"):
        sd["namespaces"] = {"names": ns_sel.get("matchNames") or [monitor["metadata"]["namespace"]]}
    return sd


def _selector_keeps(monitor: dict[str, Any], meta: str) -> list[dict[str, Any]]:
    """prometheus-operator's keep rules for the monitor's matchLabels, on the `meta` object's
    labels (`pod` for a PodMonitor, `service` for a ServiceMonitor)."""
    selector = monitor["spec"].get("selector", {})
    if selector.get("matchExpressions"):
        raise ValueError(f"matchExpressions in the {monitor['kind']} selector are not translated")
    return [
        {
            "action": "keep",
            "source_labels": [
                f"__meta_kubernetes_{meta}_label_{_sanitize(key)}",
                f"__meta_kubernetes_{meta}_labelpresent_{_sanitize(key)}",
            ],
            "regex": f"({re.escape(value)});true",
        }
        for key, value in sorted(selector.get("matchLabels", {}).items())
    ]


def _relabel_config(rule: dict[str, Any]) -> dict[str, Any]:
    """A prometheus-operator RelabelConfig (camelCase) as Prometheus's relabel_config."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in rule.items()}


def podmonitor_scrape_configs(
    podmonitor: dict[str, Any], kubeconfig: str | None = None
) -> list[dict[str, Any]]:
    """The scrape jobs prometheus-operator generates for this PodMonitor."""
    meta, spec = podmonitor["metadata"], podmonitor["spec"]
    ns, name = meta["namespace"], meta["name"]
    sd = _kubernetes_sd("pod", podmonitor, kubeconfig)
    jobs = []
    for i, ep in enumerate(spec["podMetricsEndpoints"]):
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
        ]
        relabel += _selector_keeps(podmonitor, "pod")
        relabel += [
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": ep["port"],
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container",
            },
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{ns}/{name}"},
            {"target_label": "endpoint", "replacement": ep["port"]},
        ]
        relabel += [_relabel_config(r) for r in ep.get("relabelings", [])]
        job: dict[str, Any] = {
            "job_name": f"podMonitor/{ns}/{name}/{i}",
            "honor_labels": False,
            "kubernetes_sd_configs": [dict(sd)],  # a copy: no YAML anchors
            "metrics_path": ep.get("path", "/metrics"),
            "relabel_configs": relabel,
        }
        if "metricRelabelings" in ep:
            job["metric_relabel_configs"] = [_relabel_config(r) for r in ep["metricRelabelings"]]
        if "interval" in ep:
            job["scrape_interval"] = ep["interval"]
        jobs.append(job)
    return jobs


def servicemonitor_scrape_configs(
    servicemonitor: dict[str, Any], kubeconfig: str | None = None
) -> list[dict[str, Any]]:
    """The scrape jobs prometheus-operator generates for this ServiceMonitor, on EndpointSlices
    (its `serviceDiscoveryRole: EndpointSlice`; the Endpoints API is deprecated): keep the
    Services the selector matches and the endpoint port it names, then label each target with
    namespace, service, pod, container, job = the Service's name and endpoint = the port name."""
    meta, spec = servicemonitor["metadata"], servicemonitor["spec"]
    ns, name = meta["namespace"], meta["name"]
    sd = _kubernetes_sd("endpointslice", servicemonitor, kubeconfig)
    jobs = []
    for i, ep in enumerate(spec["endpoints"]):
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        ]
        relabel += _selector_keeps(servicemonitor, "service")
        relabel += [
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
                "regex": ep["port"],
            },
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container",
            },
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            {"target_label": "endpoint", "replacement": ep["port"]},
        ]
        job: dict[str, Any] = {
            "job_name": f"serviceMonitor/{ns}/{name}/{i}",
            "honor_labels": False,
            "kubernetes_sd_configs": [dict(sd)],
            "metrics_path": ep.get("path", "/metrics"),
            "relabel_configs": relabel,
        }
        if "interval" in ep:
            job["scrape_interval"] = ep["interval"]
        if "scrapeTimeout" in ep:
            job["scrape_timeout"] = ep["scrapeTimeout"]
        jobs.append(job)
    return jobs


def kubernetes_sd_pod_targets(
    pod: dict[str, Any], addresses: dict[str, str], phase: str = "Running"
) -> list[dict[str, Any]]:
    """The targets Prometheus's kubernetes_sd (role: pod) discovers for `pod`, as static_configs
    entries: one per named container port, with the `__meta_kubernetes_*` labels the PodMonitor's
    relabelling reads. `addresses` maps a port name to the `host:port` really scraped (local
    processes stand in for the pod's IP), so the relabelling runs unchanged on static targets.
    """
    meta = pod["metadata"]
    labels: dict[str, str] = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_phase": phase,
    }
    for key, value in (meta.get("labels") or {}).items():
        labels[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = str(value)
        labels[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
    targets = []
    for container in pod["spec"]["containers"]:
        for port in container.get("ports", []):
            if port.get("name") not in addresses:
                continue
            targets.append(
                {
                    "targets": [addresses[port["name"]]],
                    "labels": labels
                    | {
                        "__meta_kubernetes_pod_container_name": container["name"],
                        "__meta_kubernetes_pod_container_port_name": port["name"],
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    },
                }
            )
    return targets


def podmonitor_static_scrape_configs(
    podmonitor: dict[str, Any], targets: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """podmonitor_scrape_configs with static `targets` (kubernetes_sd_pod_targets) in place of
    kubernetes_sd: the same jobs, interval and relabelling, for engines run as local processes."""
    jobs = podmonitor_scrape_configs(podmonitor)
    for job in jobs:
        del job["kubernetes_sd_configs"]
        job["static_configs"] = [dict(t) for t in targets]
    return jobs


def servicemonitor_static_scrape_configs(
    servicemonitor: dict[str, Any], service: str, address: str
) -> list[dict[str, Any]]:
    """The operator's ServiceMonitor as static jobs scraping `address`. Simplified: the target
    labels prometheus-operator's endpoints relabelling ends with (namespace, service, job =
    the Service's name, endpoint = the port name) are set directly, not derived from
    endpoints SD; path, interval and timeout come from the ServiceMonitor."""
    ns = servicemonitor["metadata"]["namespace"]
    name = servicemonitor["metadata"]["name"]
    jobs = []
    for i, ep in enumerate(servicemonitor["spec"]["endpoints"]):
        job: dict[str, Any] = {
            "job_name": f"serviceMonitor/{ns}/{name}/{i}",
            "honor_labels": False,
            "metrics_path": ep.get("path", "/metrics"),
            "static_configs": [
                {
                    "targets": [address],
                    "labels": {
                        "namespace": ns,
                        "service": service,
                        "job": service,
                        "endpoint": ep["port"],
                    },
                }
            ],
        }
        if "interval" in ep:
            job["scrape_interval"] = ep["interval"]
        if "scrapeTimeout" in ep:
            job["scrape_timeout"] = ep["scrapeTimeout"]
        jobs.append(job)
    return jobs


def rule_groups(prometheusrule: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule as a Prometheus rule file."""
    return {"groups": prometheusrule["spec"]["groups"]}


def adapter_config(docs: list[dict[str, Any]]) -> str:
    """prometheus-adapter's config.yaml from the chart's ConfigMap."""
    return str(one(docs, "ConfigMap", "-prometheus-adapter")["data"]["config.yaml"])


def prometheus_config(docs: list[dict[str, Any]], kubeconfig: str | None) -> dict[str, Any]:
    """prometheus.yml: the engines' PodMonitor's jobs, the operator's ServiceMonitor's, and the
    chart's rules."""
    return {
        "global": {"evaluation_interval": "15s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": podmonitor_scrape_configs(one(docs, "PodMonitor", "-engines"), kubeconfig)
        + [
            job
            for sm in docs
            if sm.get("kind") == "ServiceMonitor"
            for job in servicemonitor_scrape_configs(sm, kubeconfig)
        ],
    }


def write(
    out: pathlib.Path,
    kubeconfig: str | None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    queue_depth_interval: str | None = None,
) -> None:
    """Write prometheus.yml, rules.yml and adapter.yaml into `out`, for the chart installed as
    `release` in `namespace` (its ServiceMonitor selects that release's operator pods), with
    the chart's `monitoring.podMonitor.queueDepthInterval` unless `queue_depth_interval` is
    given ("" scrapes the queue depth with the rest)."""
    values = MONITORING_VALUES
    if queue_depth_interval is not None:
        pod_monitor = MONITORING_VALUES["monitoring"]["podMonitor"]
        values = MONITORING_VALUES | {
            "monitoring": MONITORING_VALUES["monitoring"]
            | {"podMonitor": pod_monitor | {"queueDepthInterval": queue_depth_interval}}
        }
    docs = render(values, release=release, namespace=namespace)
    out.mkdir(parents=True, exist_ok=True)
    dump = {"sort_keys": False, "default_flow_style": False}
    (out / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(docs, kubeconfig), **dump))
    (out / "rules.yml").write_text(yaml.safe_dump(rule_groups(one(docs, "PrometheusRule")), **dump))
    (out / "adapter.yaml").write_text(adapter_config(docs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write prometheus.yml, rules.yml, adapter.yaml")
    w.add_argument("--out", type=pathlib.Path, required=True)
    w.add_argument("--kubeconfig", help="kubeconfig for Prometheus's Kubernetes SD")
    w.add_argument("--release", default=RELEASE, help=f"the chart's release [{RELEASE}]")
    w.add_argument("--namespace", default=NAMESPACE, help=f"the release's namespace [{NAMESPACE}]")
    w.add_argument(
        "--queue-depth-interval",
        help="monitoring.podMonitor.queueDepthInterval ('' = with the rest) [the chart's]",
    )
    args = parser.parse_args()
    write(
        args.out,
        args.kubeconfig,
        release=args.release,
        namespace=args.namespace,
        queue_depth_interval=args.queue_depth_interval,
    )


if __name__ == "__main__":
    main()
