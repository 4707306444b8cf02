"""The chart's PromQL against a real Prometheus fed by real processes: faults make alerts true,
and every Grafana panel query returns data.

No real node is needed. The real operator (`llmop run`, on the kwok cluster) renders a simulator
LLMDeployment; the pod template it writes (labels, container and port names) becomes a static
target carrying exactly the `__meta_kubernetes_*` labels kubernetes_sd would give that pod, and
the target's addresses point at a real agent + simulator started as local processes. Prometheus
(3.16, built from Go modules) scrapes it with the jobs and relabelling the chart's PodMonitor
implies (e2e/metrics/metrics_config.py, the same translation `make dev` uses), scrapes the
operator through its ServiceMonitor's path and interval, and loads the chart's PrometheusRule.
Everything comes from one chart render; the only values changed are intervals (5 s scrapes and
evaluation, `for: 10s`) so the test runs in about a minute and a half.

A second replica stays loading throughout (its engine's port closed): it must be scraped as
loading and not ready, with no queue-depth series, so prometheus-adapter's query (the chart's
metricsQuery) returns only the serving pod and the HPA counts the loading one as missing
(docs/operations.md, "Loading replicas and the HPA").

Then: steady traffic (both alert expressions empty), the simulator's `slow` fault until
LLMOpTimeToFirstTokenHigh's expression is true and the alert fires, its `error` fault until
LLMOpRequestErrorRateHigh's does, and last every query of the chart's dashboard (panels and
template variables) evaluated by Prometheus: each must return at least one series with a
finite value.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from engine.fleet import FAST_AGENT_ENV
from support.cluster import wait_until
from support.harness.loadgen import stream_completion
from support.harness.replicas import Replica, free_port
from support.manifests import simulator_spec
from support.metrics import load_metrics_config, metrics_bin_dir
from support.operator import Kit, OperatorProcess

pytestmark = [pytest.mark.cluster, pytest.mark.engine, pytest.mark.metrics]

NAME = "chat"
INTERVAL_S = 5
# Chart values: monitoring on, intervals short. Thresholds and expressions stay the defaults.
VALUES: dict[str, Any] = {
    "metrics": {
        "serviceMonitor": {"enabled": True, "interval": f"{INTERVAL_S}s", "scrapeTimeout": "4s"}
    },
    "monitoring": {
        "podMonitor": {"enabled": True, "interval": f"{INTERVAL_S}s"},
        "prometheusRule": {"enabled": True, "for": "10s"},
        "grafanaDashboard": {"enabled": True},
        "prometheusAdapter": {"enabled": True},
    },
}
TTFT_ALERT = "LLMOpTimeToFirstTokenHigh"
ERROR_ALERT = "LLMOpRequestErrorRateHigh"
# A decode step 100x slower: 20 ms -> 2 s, so every new request's first token takes > 1 s.
SLOW_FACTOR = 100


@dataclass
class Load:
    """Clients sending short streaming completions back to back until stopped."""

    api_url: str
    clients: int = 4
    outcomes: dict[str, int] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:

            async def client() -> None:
                while not self.stop.is_set():
                    outcome, reason = await stream_completion(http, self.api_url, "sim-model", 4)
                    key = reason or outcome
                    self.outcomes[key] = self.outcomes.get(key, 0) + 1
                    await asyncio.sleep(0.05)

            await asyncio.gather(*(client() for _ in range(self.clients)))


@dataclass
class Chart:
    """What one render of the chart (VALUES) gives the test."""

    podmonitor: dict[str, Any]
    servicemonitor: dict[str, Any]
    rules: dict[str, Any]
    dashboard: dict[str, Any]
    adapter: dict[str, Any]

    @classmethod
    def render(cls) -> Chart:
        mc = load_metrics_config()
        docs = mc.render(VALUES)
        return cls(
            podmonitor=mc.one(docs, "PodMonitor", "-engines"),
            servicemonitor=mc.one(docs, "ServiceMonitor"),
            rules=mc.rule_groups(mc.one(docs, "PrometheusRule")),
            dashboard=json.loads(mc.one(docs, "ConfigMap", "-dashboard")["data"]["llmop.json"]),
            adapter=yaml.safe_load(mc.adapter_config(docs)),
        )

    def adapter_query(self, namespace: str, pods: list[str]) -> str:
        """The PromQL prometheus-adapter sends for the HPA's request over `pods` (its
        metricsQuery template, filled the way the adapter fills it for a pods query)."""
        (rule,) = self.adapter["rules"]
        series = rule["seriesQuery"].split("{")[0]
        matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
        return str(
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", "pod")
        )

    def alert_expr(self, alert: str) -> str:
        for group in self.rules["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == alert:
                    return str(rule["expr"])
        raise KeyError(alert)

    def panel_queries(self, namespace: str) -> list[tuple[str, str]]:
        """(panel title, PromQL) of every dashboard target, variables set to this deployment."""
        out = []
        for panel in self.dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = (
                    target["expr"].replace("$namespace", namespace).replace("$llmdeployment", NAME)
                )
                out.append((panel["title"], expr))
        return out

    def variable_queries(self) -> list[tuple[str, str, str]]:
        """(variable, metric selector, label) of every `label_values(selector, label)` variable."""
        out = []
        for var in self.dashboard["templating"]["list"]:
            if var["type"] != "query":
                continue
            inner = var["definition"].removeprefix("label_values(").removesuffix(")")
            selector, _, label = inner.rpartition(",")
            out.append((var["name"], selector.replace("$namespace", ".*"), label.strip()))
        return out


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    async def query(self, http: aiohttp.ClientSession, expr: str) -> list[dict[str, Any]]:
        async with http.get(self.url + "/api/v1/query", params={"query": expr}) as r:
            body = await r.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def label_values(
        self, http: aiohttp.ClientSession, selector: str, label: str
    ) -> list[str]:
        url = f"{self.url}/api/v1/label/{label}/values"
        async with http.get(url, params={"match[]": selector}) as r:
            body = await r.json()
        assert body["status"] == "success", (selector, body)
        return list(body["data"])

    async def alert_state(self, http: aiohttp.ClientSession, alert: str, ns: str) -> str | None:
        async with http.get(self.url + "/api/v1/alerts") as r:
            body = await r.json()
        for a in body["data"]["alerts"]:
            labels = a["labels"]
            key = (labels.get("alertname"), labels.get("namespace"), labels.get("llmdeployment"))
            if key == (alert, ns, NAME):
                return str(a["state"])
        return None

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_prometheus(directory: Path, config: dict[str, Any], rules: dict[str, Any]) -> Prometheus:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    bin_dir = metrics_bin_dir()
    check = subprocess.run(
        [str(bin_dir / "promtool"), "check", "config", str(directory / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log = directory / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(bin_dir / "prometheus"),
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{prom.log_tail()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(prom.url + "/-/ready") as r:
            return bool(r.status == 200)
        return False

    wait_until(ready, timeout=60, interval=0.3, what="prometheus /-/ready")
    return prom


def finite(result: list[dict[str, Any]]) -> list[float]:
    return [v for v in (float(s["value"][1]) for s in result) if math.isfinite(v)]


async def until(
    what: str, probe: Callable[[], Awaitable[object]], timeout: float, interval: float = 0.5
) -> float:
    """Seconds until the async `probe()` is truthy."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if await probe():
            return time.monotonic() - started
        await asyncio.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Replica]:
    """A real agent + simulator: the engine pod's two containers' processes, on free ports."""
    r = Replica.start(
        tmp_path / "engine", engine_args=["--sim-load-seconds", "0.5"], env=FAST_AGENT_ENV
    )
    try:
        asyncio.run(r.wait_ready(30))
        yield r
    finally:
        r.stop()


@pytest.fixture
def loading_replica(tmp_path: Path) -> Iterator[Replica]:
    """A second replica whose engine loads for longer than the test: the HPA's loading pod."""
    r = Replica.start(
        tmp_path / "loading", engine_args=["--sim-load-seconds", "600"], env=FAST_AGENT_ENV
    )
    try:
        yield r
    finally:
        r.stop()


@pytest.mark.timeout(240)
def test_faults_make_alerts_true_and_every_dashboard_query_has_data(
    *,
    operator: OperatorProcess,
    kit: Kit,
    namespace: str,
    replica: Replica,
    loading_replica: Replica,
    tmp_path: Path,
) -> None:
    chart = Chart.render()
    mc = load_metrics_config()
    kit.apply_llmd(namespace, NAME, simulator_spec())
    deployment = wait_until(
        lambda: kit.deployment(namespace, NAME), timeout=60, what="the operator's Deployment"
    )
    template = deployment["spec"]["template"]
    # Two pods the Deployment makes, standing at the local processes' addresses.
    targets = []
    for i, r in enumerate((replica, loading_replica)):
        pod = {
            "metadata": {**template["metadata"], "namespace": namespace, "name": f"{NAME}-{i}"},
            "spec": template["spec"],
        }
        found = mc.kubernetes_sd_pod_targets(
            pod, {"http": f"127.0.0.1:{r.api_port}", "probe": f"127.0.0.1:{r.probe_port}"}
        )
        ports = {t["labels"]["__meta_kubernetes_pod_container_port_name"] for t in found}
        assert ports == {"http", "probe"}, template
        targets += found
    config = {
        "global": {"scrape_interval": f"{INTERVAL_S}s", "evaluation_interval": f"{INTERVAL_S}s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": mc.podmonitor_static_scrape_configs(chart.podmonitor, targets)
        + mc.servicemonitor_static_scrape_configs(
            chart.servicemonitor, "llmop", f"127.0.0.1:{operator.metrics_port}"
        ),
    }
    prom = start_prometheus(tmp_path / "prometheus", config, chart.rules)
    try:
        measured = asyncio.run(
            scenario(
                prom,
                chart,
                kit=kit,
                namespace=namespace,
                replica=replica,
                loading=loading_replica,
            )
        )
    except BaseException:
        print("--- prometheus log ---\n" + prom.log_tail())
        print("--- engine log ---\n" + replica.log_tail())
        print("--- loading engine log ---\n" + loading_replica.log_tail())
        raise
    finally:
        prom.stop()
    print("\n" + "\n".join(f"{k}: {v}" for k, v in measured.items()))


async def scenario(  # noqa: PLR0915
    prom: Prometheus,
    chart: Chart,
    *,
    kit: Kit,
    namespace: str,
    replica: Replica,
    loading: Replica,
) -> dict[str, object]:
    measured: dict[str, object] = {}
    ttft_expr, error_expr = chart.alert_expr(TTFT_ALERT), chart.alert_expr(ERROR_ALERT)
    panels = chart.panel_queries(namespace)
    probe_latency = next(q for t, q in panels if t.startswith("Deep probe") and "latency" in q)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

        async def has(expr: str) -> bool:
            return bool(finite(await prom.query(http, expr)))

        # Idle: the agent's deep probes (every 2 s) give the probe-latency panel its data. The
        # operator is scraped once, then the CR changes so a reconcile falls inside the window.
        await until("operator scraped", lambda: has("llmop_reconciles_total"), 30)
        kit.apply_llmd(namespace, NAME, simulator_spec(replicas=2))
        await until("deep probe latency", lambda: has(probe_latency), 40)

        load = Load(replica.api_url)
        load_task = asyncio.create_task(load.run())
        try:
            # Steady traffic: the TTFT histogram has a rate; neither alert expression is true.
            ttft_p99 = next(q for t, q in panels if t.startswith("Time to first") and "0.99" in q)
            await until("TTFT rate", lambda: has(ttft_p99), 40)
            # Client traffic (not only the idle probes) in Prometheus before the baseline.
            served = (
                f'sum(vllm:request_success_total{{namespace="{namespace}", '
                f'llmdeployment="{NAME}", finished_reason="length"}}) >= 50'
            )
            await until("50 client requests scraped", lambda: has(served), 40)
            assert await prom.query(http, ttft_expr) == [], "TTFT alert true on healthy traffic"
            assert await prom.query(http, error_expr) == [], "error alert true without errors"
            measured["healthy p99 TTFT (s)"] = finite(await prom.query(http, ttft_p99))

            # The loading replica (pod -1) is scraped, says it is loading and not ready, and has
            # no queue-depth series: the adapter's own query for both pods returns only the
            # serving one, so the HPA counts the loading pod as missing, not as an idle 0.
            pod0, pod1 = f"{NAME}-0", f"{NAME}-1"
            phase = await prom.query(http, f'llmop_engine_phase{{pod="{pod1}"}} == 1')
            assert [s["metric"]["phase"] for s in phase] == ["loading"], phase
            ready = await prom.query(http, f'llmop_engine_ready{{pod="{pod1}"}}')
            assert finite(ready) == [0.0], ready
            assert await prom.query(http, f'llmop_engine_queue_depth{{pod="{pod1}"}}') == []
            adapter = await prom.query(http, chart.adapter_query(namespace, [pod0, pod1]))
            assert [s["metric"]["pod"] for s in adapter] == [pod0], adapter
            # One writer per queue-depth sample: the PodMonitor's 5 s job of its own.
            depth = await prom.query(http, f'llmop_engine_queue_depth{{pod="{pod0}"}}')
            assert [s["metric"].get("llmop_scrape") for s in depth] == ["queue-depth"], depth
            measured["adapter query over a serving and a loading pod"] = {
                s["metric"]["pod"]: s["value"][1] for s in adapter
            }

            async with http.post(
                replica.api_url + "/sim/fault", json={"mode": "slow", "slowFactor": SLOW_FACTOR}
            ) as r:
                r.raise_for_status()
            t0 = time.monotonic()
            await until("TTFT expression", lambda: prom.query(http, ttft_expr), 60)
            measured["slow fault -> TTFT alert expression true (s)"] = round(
                time.monotonic() - t0, 1
            )
            result = await prom.query(http, ttft_expr)
            assert {(s["metric"]["namespace"], s["metric"]["llmdeployment"]) for s in result} == {
                (namespace, NAME)
            }, result
            measured["p99 TTFT the expression saw (s)"] = finite(result)

            async def firing(alert: str) -> bool:
                return await prom.alert_state(http, alert, namespace) == "firing"

            await until(f"{TTFT_ALERT} firing", lambda: firing(TTFT_ALERT), 60)
            measured["slow fault -> TTFT alert firing (for: 10s) (s)"] = round(
                time.monotonic() - t0, 1
            )

            async with http.post(replica.api_url + "/sim/fault", json={"mode": "error"}) as r:
                r.raise_for_status()
            t0 = time.monotonic()
            await until("error-rate expression", lambda: prom.query(http, error_expr), 60)
            measured["error fault -> error-rate alert expression true (s)"] = round(
                time.monotonic() - t0, 1
            )
            measured["error ratio the expression saw"] = finite(await prom.query(http, error_expr))
            await until(f"{ERROR_ALERT} firing", lambda: firing(ERROR_ALERT), 60)
            measured["error fault -> error-rate alert firing (for: 10s) (s)"] = round(
                time.monotonic() - t0, 1
            )
        finally:
            load.stop.set()
            await load_task
        measured["client outcomes"] = dict(load.outcomes)

        # Every dashboard query: at least one series, and a finite value among them.
        counts: dict[str, int] = {}
        empty: list[tuple[str, str, object]] = []
        for title, expr in panels:
            result = await prom.query(http, expr)
            counts[f"{title} | {expr[:60]}"] = len(result)
            if not finite(result):
                empty.append((title, expr, result))
        for var, selector, label in chart.variable_queries():
            values = await prom.label_values(http, selector, label)
            counts[f"variable {var}"] = len(values)
            if (namespace if var == "namespace" else NAME) not in values:
                empty.append((var, selector, values))
        measured["dashboard query -> series"] = counts
        assert not empty, f"dashboard queries without data: {empty}"
    return measured
