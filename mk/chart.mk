# The Helm chart (helm/llmop). Linted and rendered in-process by the Helm v4 SDK from PyPI
# (helm-python-sdk, a ctypes binding of Helm's Go SDK): no helm binary and no download at run
# time. The same checks run inside `make test` (tests/chart/).

CHART_DIR := helm/llmop

##@ Chart

.PHONY: chart-lint
chart-lint: install ## Lint the chart (strict) and render it over the default and matrix values.
	$(BIN)/pytest -q -p no:cacheprovider tests/chart/test_chart_render.py

.PHONY: chart-test
chart-test: install cluster-binaries ## Chart tests incl. server-side dry run and a real install on the local cluster.
	$(BIN)/pytest -q -p no:cacheprovider tests/chart tests/gitops

.PHONY: chart-template
chart-template: install ## Print the chart's manifests for the default values (like `helm template`).
	@$(PY) -c 'import sys, helm_python as helm; \
	  chart = helm.Chart.load("$(CHART_DIR)"); \
	  out = chart.render({}, name="llmop", namespace="llmop-system"); \
	  sys.stdout.write("".join(f"---\n# Source: {k}\n{v.strip()}\n" for k, v in sorted(out.items()) if not k.endswith("NOTES.txt") and v.strip()))'
