"""Suite-wide pytest configuration: loads the shared fixtures from ``tests/support``."""

# The cluster fixtures (kube_cluster, namespace) live in support.cluster so that
# other tooling can import start_cluster/stop_cluster without pytest magic.
# support.metrics builds prometheus/promtool/prometheus-adapter before `metrics` tests run.
# support.egress holds the egress guard for the session and runs the suite_end tests last.
pytest_plugins = ["support.cluster", "support.metrics", "support.egress"]
