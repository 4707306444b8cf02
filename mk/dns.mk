# The real node's cluster DNS: CoreDNS built from Go modules (e2e/cluster/build-dns.sh, the
# plugins chosen in e2e/cluster/coredns/main.go); node.sh starts it beside the kubelet.

##@ Cluster DNS

.PHONY: dns-binaries
dns-binaries: ## Build (or reuse from ~/.cache/llmop) CoreDNS for the real node's cluster DNS.
	@e2e/cluster/build-dns.sh >/dev/null

# node.sh starts it with every real node: build it in the open, before pytest.
test-prereqs-first: dns-binaries
