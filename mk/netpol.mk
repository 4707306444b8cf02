# kube-router's NetworkPolicy controller, which the e2e tests run on the real node to prove the
# NetworkPolicies llmop ships (kube-proxy enforces none). Logic lives in
# e2e/cluster/build-kube-router.sh and tests/support/netpol_enforcer.py.

##@ NetworkPolicy enforcement

.PHONY: netpol-binaries
netpol-binaries: ## Build (or reuse from ~/.cache/llmop) kube-router, the e2e tests' NetworkPolicy enforcer.
	@e2e/cluster/build-kube-router.sh >/dev/null

# The real-node tests start it: build it in the open, before pytest.
test-prereqs-first: netpol-binaries
