# Local Kubernetes control plane (real etcd/apiserver/controller-manager/scheduler
# built from Go modules, kwok-simulated GPU nodes). Logic lives in e2e/cluster/;
# these targets are thin wrappers so people, CI and the pytest fixture share it.

CLUSTER_SH := e2e/cluster/cluster.sh

##@ Local cluster

.PHONY: cluster-binaries
cluster-binaries: ## Build (or reuse from ~/.cache/llmop) the control-plane, etcd and kwok binaries.
	@e2e/cluster/build.sh >/dev/null

.PHONY: cluster-up
cluster-up: install ## Start the local cluster with fake GPU nodes (idempotent); prints the kubeconfig path.
	@LLMOP_PYTHON=$(abspath $(PY)) $(CLUSTER_SH) up

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and remove its state.
	@$(CLUSTER_SH) down

.PHONY: cluster-status
cluster-status: ## Show the local cluster's nodes, GPUs and process memory.
	@$(CLUSTER_SH) status

.PHONY: cluster-kubeconfig
cluster-kubeconfig: ## Print the local cluster's kubeconfig path (use with make -s).
	@$(CLUSTER_SH) kubeconfig

# The full suite runs the cluster smoke tests: build the binaries first, in the
# open, so a cold build shows up in the CI log instead of inside pytest.
test-prereqs-first: cluster-binaries
