"""Every alert of the chart's PrometheusRule, unit-tested by the real promtool.

The rules are rendered from helm/llmop (prometheusRule.enabled, kubeStateMetrics on, so every
alert is there) into a temp dir: the test file tests/chart/promtool/alerts_test.yml runs against
what the chart ships, never a copy. promtool is Prometheus's own, built from Go modules
(e2e/cluster/build-metrics.sh), so the PromQL is parsed and evaluated by the same engine a
cluster's Prometheus runs.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from support.metrics import load_metrics_config, metrics_bin_dir

pytestmark = pytest.mark.metrics

TESTS_YML = pathlib.Path(__file__).parent / "promtool" / "alerts_test.yml"
ALL_ALERTS = {"monitoring": {"prometheusRule": {"enabled": True, "kubeStateMetrics": True}}}


def rendered_rules() -> dict[str, Any]:
    mc = load_metrics_config()
    rules: dict[str, Any] = mc.rule_groups(mc.one(mc.render(ALL_ALERTS), "PrometheusRule"))
    return rules


def alert_names(rules: dict[str, Any]) -> set[str]:
    return {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}


@pytest.fixture(scope="module")
def promtool() -> pathlib.Path:
    return metrics_bin_dir() / "promtool"


@pytest.fixture
def rules_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rendered_rules(), sort_keys=False))
    shutil.copy(TESTS_YML, tmp_path / TESTS_YML.name)
    return tmp_path


def test_every_alert_has_a_promtool_test() -> None:
    tests = yaml.safe_load(TESTS_YML.read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
    firing = {
        t["alertname"]
        for case in tests["tests"]
        for t in case["alert_rule_test"]
        if t.get("exp_alerts")
    }
    shipped = alert_names(rendered_rules())
    assert len(shipped) >= 6
    assert tested == shipped, f"untested: {shipped - tested}; unknown: {tested - shipped}"
    assert firing == shipped, f"alerts never seen firing in a test: {shipped - firing}"


def test_rules_pass_promtool_check(promtool: pathlib.Path, rules_dir: pathlib.Path) -> None:
    res = subprocess.run(
        [str(promtool), "check", "rules", str(rules_dir / "rules.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(alert_names(rendered_rules()))} rules found" in res.stdout


def test_alerts_fire_on_real_metric_names(promtool: pathlib.Path, rules_dir: pathlib.Path) -> None:
    res = subprocess.run(
        [str(promtool), "test", "rules", TESTS_YML.name],
        cwd=rules_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr
