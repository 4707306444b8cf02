# kube-router's NetworkPolicy controller, which the e2e tests run on the real node to prove the
# NetworkPolicies llmop ships (kube-proxy enforces none). Logic lives in
# e2e/cluster/build-kube-router.sh and tests/support/netpol_enforcer.py.

##@ NetworkPolicy enforcement

.PHONY: netpol-binaries
netpol-binaries: ## Build (or reuse from ~/.cache/llmop) kube-router, the e2e tests' NetworkPolicy enforcer.
	@e2e/cluster/build-kube-router.sh >/dev/null

# Only tests/e2e/test_helm_install.py starts it, and that module runs late in its session (it
# waits for the metrics pipeline): build it beside the sessions; the test's own call of the
# build script waits for that build (one lock) or reuses it.
test-prereqs-beside: netpol-binaries
