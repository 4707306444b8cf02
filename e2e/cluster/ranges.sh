# Every address range the local cluster hands out, in one place (sourced by cluster.sh, node.sh
# and egress-guard.sh; tests read it through `egress-guard.sh ranges`). None of them overlaps
# another, and none may ever take this machine's default route: egress-guard.sh routes each one
# locally and counts (and drops) any packet to them that would still leave through the default
# route's interface.
# shellcheck shell=bash disable=SC2034 # the variables are read by the scripts that source this

# The API server's Service CIDR (--service-cluster-ip-range) and the `kubernetes` Service's
# ClusterIP, its first address (the API server's certificate names it: pods verify it).
SERVICE_CIDR=10.0.0.0/24
KUBERNETES_SERVICE_IP=10.0.0.1
# Extra Service CIDRs that tests and benches add as ServiceCIDR objects (bench/operator_bench.py
# adds 10.96.0.0/16 for a Service per CR at N=1,000).
EXTRA_SERVICE_CIDRS=(10.96.0.0/16)
# kwok's fake pods (kwok-controller --cidr): addresses nothing serves.
KWOK_POD_CIDR=10.250.0.0/16
# The real node's pods, on its bridge (node.sh), and the node's own address (a /32 on lo). The
# API server advertises the node's address as the `kubernetes` Service's endpoint (cluster.sh):
# node.sh forwards it, from the pods' bridge only, to the API server's loopback listener.
REAL_NODE_POD_CIDR=10.244.7.0/24
REAL_NODE_IP=10.255.7.1

# Everything the guard keeps on this machine. The node IP is listed too: it is a local address
# (on lo) while the node runs, which wins over the guard's route; without a node, a read of the
# `kubernetes` endpoint fails here instead of taking the default route.
LOCAL_RANGES=("$SERVICE_CIDR" "${EXTRA_SERVICE_CIDRS[@]}" "$KWOK_POD_CIDR" "$REAL_NODE_POD_CIDR" "$REAL_NODE_IP/32")
