# The LeaderWorkerSet controller (sigs.k8s.io/lws v0.9.0) that every local cluster runs as a host
# process (multi-node serving needs it). Logic lives in e2e/cluster/build-lws.sh and e2e/lws/.

##@ LeaderWorkerSet

.PHONY: lws-binaries
lws-binaries: ## Build (or reuse from ~/.cache/llmop) the LeaderWorkerSet controller manager and its CRDs.
	@e2e/cluster/build-lws.sh >/dev/null

# cluster.sh starts it in every cluster the tests use: build it in the open, before pytest.
test-prereqs-first: lws-binaries

.PHONY: bench-groups
bench-groups: install cluster-binaries lws-binaries dns-binaries ## Multi-node groups on the real node: llmop vs KServe's group pod spec: Ready, rollout loss, a hung worker (table).
	$(PY) bench/group_bench.py

bench: bench-groups
