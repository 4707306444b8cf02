# The metrics pipeline (Prometheus, promtool, prometheus-adapter built from Go modules; config
# rendered from the chart). Logic lives in e2e/cluster/build-metrics.sh and e2e/metrics/.

##@ Metrics

.PHONY: metrics-binaries
metrics-binaries: ## Build (or reuse from ~/.cache/llmop) prometheus, promtool and prometheus-adapter.
	@e2e/cluster/build-metrics.sh >/dev/null

.PHONY: alert-test
alert-test: install metrics-binaries ## promtool unit tests of the chart's alerts (rendered from the chart).
	$(BIN)/pytest -q -p no:cacheprovider tests/chart/test_alert_rules.py tests/chart/test_metrics_config.py

# The full suite needs them only in its `metrics` modules, which run last in each session:
# `make test` builds them beside the first tests, in the open (`[beside]` lines in the CI log),
# and those modules wait for that build before they start (CI never skips them).
test-prereqs-beside: metrics-binaries

.PHONY: bench-autoscale
bench-autoscale: install cluster-binaries metrics-binaries ## Load step on an autoscaled LLMDeployment: HPA reaction, scale-down loss, pipeline cost (real node; HPA_SYNC=5s, QUEUE_DEPTH_INTERVAL=off|5s, TIMELINE=1).
	$(PY) bench/autoscale_bench.py $(if $(HPA_SYNC),--hpa-sync $(HPA_SYNC)) $(if $(QUEUE_DEPTH_INTERVAL),--queue-depth-interval $(QUEUE_DEPTH_INTERVAL)) $(if $(TIMELINE),--timeline)
