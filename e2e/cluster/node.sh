#!/usr/bin/env bash
# A REAL node for the local cluster: containerd + runc + CNI plugins from Debian packages, and the
# kubelet + kube-proxy built from the same helper Go module as the control plane (build.sh). It
# joins the cluster that cluster.sh started, beside the kwok GPU nodes, and runs real containers:
# the kubelet executes probes and preStop hooks, kube-proxy programs ClusterIP Services, so the
# engine's promises (probes, drain, scaling) meet real Kubernetes instead of kwok's instant Ready.
# The cluster DNS is CoreDNS (build-dns.sh) on the node's address: the kubelet names it in every
# pod's resolv.conf, so Service and pod names (a LeaderWorkerSet's leader address) resolve; names
# outside the cluster domain are refused, never forwarded.
#
# Usage (normally called by cluster.sh, which passes the cluster's name and work dir):
#   node.sh up <cluster-name> <cluster-work-dir>   join (or re-join) the node; idempotent
#   node.sh down                                   stop it and restore the host exactly
#   node.sh status                                 print who owns the node and what runs
#   node.sh check                                  exit 0 when this host can run the node, else say why
#   node.sh snapshot                               print the host state that `down` must restore
#
# One real node per machine: it needs root and changes host state (a bridge, iptables chains,
# sysctls, cgroups, mounts). A lock serialises up/down, and the owner file names the cluster that
# holds it; another cluster gets a clear refusal. `down` puts back exactly what `up` changed, from
# the snapshot `up` took first (tests/e2e/test_real_node.py compares before and after).
#
# Environment:
#   LLMOP_CACHE            cache root (default ${XDG_CACHE_HOME:-~/.cache}/llmop): containerd's
#                          image store lives there so images survive a node restart
#   LLMOP_NODE_GPUS        nvidia.com/gpu the node advertises (default 4)
#   LLMOP_NODE_GPU_PRODUCT the nvidia.com/gpu.product label (default NVIDIA-L4, a catalogued GPU)
#   LLMOP_NODE_IMAGES      images imported at start (default "pause engine-sim"; see e2e/images)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

NODE_NAME=llmop-real-node
# shellcheck source=ranges.sh
source "$HERE/ranges.sh"
# A /32 on lo: the kubelet serves there. The kubelet refuses loopback node IPs, and an address on
# lo never leaves this machine.
NODE_IP="$REAL_NODE_IP"
POD_CIDR="$REAL_NODE_POD_CIDR"
BRIDGE=llmopbr0
GPUS="${LLMOP_NODE_GPUS:-4}"
GPU_PRODUCT="${LLMOP_NODE_GPU_PRODUCT:-NVIDIA-L4}"
KUBELET_PORT=10250
KUBELET_HEALTHZ_PORT=10248
PROXY_METRICS_PORT=10249
PROXY_HEALTHZ_PORT=10256
DNS_PORT=53
DNS_READY_PORT=10253
CLUSTER_DOMAIN=cluster.local

CACHE="${LLMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
RUN_DIR=/run/llmop-node             # sockets, pids, runtime state (tmpfs, gone on reboot)
VAR_DIR=/var/lib/llmop-node         # kubelet root, CNI config, pod logs: removed by `down`
PERSIST="$CACHE/node"               # containerd's content store: kept, so images stay imported
LOG_DIR="$PERSIST/logs"
SOCK="$RUN_DIR/containerd/containerd.sock"
LOCK=/run/llmop-node.lock
SNAPSHOT="$PERSIST/host-before.snapshot"
SYSCTL_BEFORE="$PERSIST/sysctl-before.txt"
CREATED_DIRS="$PERSIST/created-dirs.txt"
# Directories outside ours that the kubelet, containerd or CNI create when missing; `down` removes
# the ones that did not exist before `up`.
FOREIGN_DIRS=(/var/log/containers /var/log/pods /run/netns /var/lib/cni /run/containerd /var/lib/kubelet /opt/containerd /etc/cni)
PACKAGES=(containerd runc containernetworking-plugins iptables conntrack openssl curl ipset)

log() { echo "node[$NODE_NAME]: $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# ---------------------------------------------------------------------------------------------
# Preconditions

# Why this host cannot run a real node (empty when it can).
why_not() {
  [[ "$(uname -s)" == Linux ]] || { echo "not Linux ($(uname -s))"; return; }
  [[ "$(id -u)" == 0 ]] || { echo "not root (the kubelet and containerd need root)"; return; }
  [[ -d /sys/fs/cgroup ]] || { echo "no /sys/fs/cgroup"; return; }
  local fs
  fs="$(cat /proc/filesystems)"
  [[ "$fs" == *overlay* ]] || { echo "the kernel has no overlayfs"; return; }
  command -v apt-get >/dev/null || command -v containerd >/dev/null ||
    { echo "containerd is not installed and there is no apt-get to install it"; return; }
  echo ""
}

install_packages() {
  local missing=() p status
  for p in "${PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing Debian packages: ${missing[*]}"
  # The packages' own service start is unwanted (no init system here, and we run containerd with
  # our own config); policy-rc.d 101 tells dpkg not to start services.
  local policy=/usr/sbin/policy-rc.d had_policy=0
  [[ -e "$policy" ]] && had_policy=1
  if ((!had_policy)); then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >"$LOG_DIR/apt.log" 2>&1 || rc=$?
  if ((rc)); then
    # A stale package list is the usual cause on a fresh machine.
    DEBIAN_FRONTEND=noninteractive apt-get update >>"$LOG_DIR/apt.log" 2>&1 || true
    rc=0
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >>"$LOG_DIR/apt.log" 2>&1 || rc=$?
  fi
  ((had_policy)) || rm -f "$policy"
  ((rc == 0)) || die "apt-get install ${missing[*]} failed (log: $LOG_DIR/apt.log); install them by hand and retry"
}

port_in_use() { # port_in_use <ip> <port>: prints the listener when taken
  local out
  out="$(ss -Hltnp "src $1:$2" 2>/dev/null || true)"
  [[ -n "$out" ]] && echo "$out"
  return 0
}

check_ports() {
  local p who
  for p in "$NODE_IP:$KUBELET_PORT" "127.0.0.1:$KUBELET_HEALTHZ_PORT" "127.0.0.1:$PROXY_METRICS_PORT" "127.0.0.1:$PROXY_HEALTHZ_PORT" "$NODE_IP:$DNS_PORT" "127.0.0.1:$DNS_READY_PORT"; do
    who="$(port_in_use "${p%:*}" "${p##*:}")"
    [[ -z "$who" ]] || die "port $p is in use by: $who — stop that process (or run 'node.sh down' if it is a leftover node) and retry"
  done
}

# ---------------------------------------------------------------------------------------------
# Host state: what `down` must put back

# Sysctls whose values move on their own and say nothing about what we changed (an awk regex).
VOLATILE_SYSCTLS='^(fs[.](dentry-state|file-nr|inode-nr|inode-state|quota[.])|kernel[.](random[.]|ns_last_pid|pty[.]nr|tainted|sched_domain|core_modes)|net[.]netfilter[.]nf_conntrack_count|vm[.](nr_|stat_)|net[.]ipv4[.](tcp_mem|udp_mem)|net[.]ipv[46][.]neigh[.]|dev[.]|user[.])'

sysctl_dump() { # sorted "key = value" lines of the stable sysctls (multi-line values skipped)
  local all
  all="$(sysctl -a 2>/dev/null || true)"
  awk -v re="$VOLATILE_SYSCTLS" 'index($0, " = ") && $1 !~ re' <<<"$all" | LC_ALL=C sort
}

# iptables-save's output less the tables that hold nothing: only built-in chains, every policy
# ACCEPT, no rule. Such a table passes every packet exactly as an absent one does, and the kernel
# (or iptables-nft) creates it on the first command that names it (a fresh machine has none until
# kube-proxy's first run), so "empty" and "absent" are the same host state.
without_empty_tables() { # without_empty_tables <iptables-save output>
  awk '
    /^\*/ { table = $0; body = ""; empty = 1; next }
    /^COMMIT/ { if (!empty) printf "%s\n%s%s\n", table, body, $0; table = ""; next }
    table == "" { print; next }
    /^:/ { if ($2 != "ACCEPT") empty = 0 }
    /^-/ { empty = 0 }
    { body = body $0 "\n" }
  ' <<<"$1"
}

# Everything `down` promises to restore, in a comparable text form. Each command's output is
# captured before it is filtered, so a missing tool (nft) cannot fail the pipeline.
snapshot() {
  local out t
  echo "## mounts"
  # Not the image builder's (e2e/images may build while a node runs): not the node's doing.
  awk -v skip="$CACHE/images/" 'index($5, skip) != 1 { print $5, $9, $10 }' /proc/self/mountinfo |
    LC_ALL=C sort
  echo "## links"
  out="$(ip -o link show)"
  sed -E 's/^[0-9]+: //; s/@[^:]+:/:/' <<<"$out" | awk '{ print $1 }' | LC_ALL=C sort
  echo "## addresses"
  out="$(ip -o addr show)"
  awk '{ print $2, $3, $4 }' <<<"$out" | LC_ALL=C sort
  echo "## routes"
  out="$(ip route show table all)"
  LC_ALL=C sort <<<"$out"
  echo "## iptables"
  for t in iptables ip6tables; do
    out="$("$t-save" 2>/dev/null || true)"
    sed -E '/^#/d; /^$/d; s/\[[0-9]+:[0-9]+\]//' <<<"$(without_empty_tables "$out")" | LC_ALL=C sort
  done
  echo "## nftables"
  if command -v nft >/dev/null; then
    out="$(nft -s list tables 2>/dev/null || true)"
    LC_ALL=C sort <<<"$out"
  fi
  echo "## sysctls"
  sysctl_dump
  echo "## cgroups"
  out="$(find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d 2>/dev/null || true)"
  LC_ALL=C sort <<<"$out"
  echo "## directories"
  local d
  for d in "${FOREIGN_DIRS[@]}" "$VAR_DIR"; do
    [[ -e "$d" ]] && echo "$d"
  done
  return 0
}

# ---------------------------------------------------------------------------------------------
# Configuration files

write_pki() { # write_pki <cluster pki dir>: node + kube-proxy client certs, kubelet serving cert
  local pki="$1" out="$VAR_DIR/pki"
  [[ -f "$pki/ca.crt" && -f "$pki/ca.key" ]] || die "no cluster CA in $pki (is the cluster up?)"
  mkdir -p "$out"
  cp "$pki/ca.crt" "$out/ca.crt"
  sign() { # sign <name> <subject> [extfile lines]
    local name="$1" subj="$2" ext="$3"
    openssl req -new -newkey rsa:2048 -nodes -keyout "$out/$name.key" -subj "$subj" -out "$out/$name.csr" 2>/dev/null
    printf '%b' "$ext" >"$out/$name.ext"
    openssl x509 -req -in "$out/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 30 -extfile "$out/$name.ext" -out "$out/$name.crt" 2>/dev/null
    rm -f "$out/$name.csr" "$out/$name.ext"
  }
  # The Node authorizer grants a kubelet exactly its own node's objects by this identity.
  sign kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" \
    "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
  # The bootstrap ClusterRoleBinding system:node-proxier already binds this user.
  sign kube-proxy "/CN=system:kube-proxy" "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
  # Signed by the cluster CA, so the API server can verify the kubelet for logs/exec.
  sign kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" \
    "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:$NODE_IP,DNS:$NODE_NAME\n"
}

write_kubeconfig() { # write_kubeconfig <file> <server> <cert name>
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "$2", certificate-authority: "$VAR_DIR/pki/ca.crt"}
users:
- name: node
  user: {client-certificate: "$VAR_DIR/pki/$3.crt", client-key: "$VAR_DIR/pki/$3.key"}
contexts:
- name: node
  context: {cluster: local, user: node}
current-context: node
EOF
}

write_corefile() { # write_corefile <kubeconfig>
  cat >"$VAR_DIR/Corefile" <<EOF
# The real node's cluster DNS (generated by e2e/cluster/node.sh). Only the cluster domain is
# served; any other name is refused (no forward plugin is even built in).
$CLUSTER_DOMAIN:$DNS_PORT {
    bind $NODE_IP
    errors
    ready 127.0.0.1:$DNS_READY_PORT
    kubernetes $CLUSTER_DOMAIN {
        kubeconfig $1
    }
}
EOF
}

write_configs() { # write_configs <api server url>
  local server="$1"
  mkdir -p "$RUN_DIR/containerd" "$VAR_DIR/cni/net.d" "$VAR_DIR/kubelet" "$VAR_DIR/pod-logs" \
    "$PERSIST/containerd" "$PERSIST/containerd-opt" "$LOG_DIR"
  cat >"$VAR_DIR/containerd.toml" <<EOF
# containerd for the llmop real node (generated by e2e/cluster/node.sh). Its own root, state and
# socket: nothing of a host containerd is touched.
version = 2
root = "$PERSIST/containerd"
state = "$RUN_DIR/containerd"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$SOCK"

[plugins."io.containerd.internal.v1.opt"]
  path = "$PERSIST/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  # Built locally by e2e/images (no registry is reachable).
  sandbox_image = "localhost/pause:3.10"
  # No CAP_SYS_RESOURCE in this VM: runc cannot lower oom_score_adj below the parent's.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN_DIR/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$VAR_DIR/cni/net.d"
EOF
  cat >"$VAR_DIR/cni/net.d/10-llmop.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "llmop",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$RUN_DIR/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
  write_kubeconfig "$VAR_DIR/kubelet.kubeconfig" "$server" kubelet-client
  write_kubeconfig "$VAR_DIR/kube-proxy.kubeconfig" "$server" kube-proxy
  cat >"$VAR_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This VM's memory controller sits in cgroup v1 hierarchies the sandbox holds; 1.35+ refuses v1
# unless told otherwise (support ends with 1.37: pin 1.36).
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $VAR_DIR/pki/kubelet-serving.crt
tlsPrivateKeyFile: $VAR_DIR/pki/kubelet-serving.key
# No anonymous access: the API server presents a client cert from the cluster CA; everything else
# is a token checked with the API server, and every request is authorised by it (Webhook).
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $VAR_DIR/pki/ca.crt}
authorization: {mode: Webhook}
# true makes the kubelet fail on this host's defaults; the sysctls it sets are restored by down.
protectKernelDefaults: false
failSwapOn: false
podLogsDir: $VAR_DIR/pod-logs
resolvConf: /etc/resolv.conf
clusterDNS: ["$NODE_IP"]
clusterDomain: $CLUSTER_DOMAIN
# Images are imported, never pulled: nothing could fetch them back after a GC.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "256Mi", nodefs.available: "2%", imagefs.available: "2%"}
serializeImagePulls: false
maxPods: 110
nodeStatusUpdateFrequency: 5s
registerWithTaints: []
EOF
  cat >"$VAR_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $VAR_DIR/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
clusterCIDR: $POD_CIDR
# No CAP_SYS_RESOURCE: the default -999 is refused.
oomScoreAdj: 0
# Zeros leave the conntrack sysctls alone; localhostNodePorts would flip route_localnet.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false, masqueradeAll: false}
EOF
}

# ---------------------------------------------------------------------------------------------
# Processes

start_bg() { # start_bg <name> <cmd...>: detached, logged, pid recorded
  local name="$1"
  shift
  # 8>&-: the lock fd must not live on in the daemons, or the next up/down waits forever.
  setsid nohup "$@" </dev/null >"$LOG_DIR/$name.log" 2>&1 8>&- &
  echo $! >"$RUN_DIR/$name.pid"
}

alive() { local f="$RUN_DIR/$1.pid"; [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null; }

stop_pid() { # stop_pid <name> [timeout s]: SIGTERM, then SIGKILL
  local f="$RUN_DIR/$1.pid" pid i
  [[ -f "$f" ]] || return 0
  pid="$(cat "$f")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < ${2:-10} * 10; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

wait_for() { # wait_for <seconds> <what> <cmd...>
  local limit="$1" deadline
  shift 2 # the second argument names what we wait for, for the reader
  deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

ctr_() { ctr --address "$SOCK" -n k8s.io "$@"; }

# ---------------------------------------------------------------------------------------------
# Commands

owner() { cat "$RUN_DIR/owner" 2>/dev/null || true; }

cmd_up() {
  local cluster="$1" work="$2"
  local reason
  reason="$(why_not)"
  [[ -z "$reason" ]] || die "this host cannot run a real node: $reason"
  mkdir -p "$RUN_DIR" "$PERSIST" "$LOG_DIR"
  exec 8>"$LOCK"
  flock 8
  local kubeconfig="$work/kubeconfig" bin
  bin="$(cat "$work/bin-dir")"
  kctl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

  local current
  current="$(owner)"
  if [[ -n "$current" && "$current" != "$cluster" ]]; then
    local other_work="${work%/*}/$current"
    if [[ -d "$other_work" ]] && alive kubelet; then
      die "the real node belongs to cluster '$current' (one per machine); run 'make cluster-down' for that cluster or LLMOP_CLUSTER_NAME=$current e2e/cluster/cluster.sh down"
    fi
    log "taking over from the gone cluster '$current'"
    cmd_down_locked
  fi
  if [[ "$current" == "$cluster" ]] && alive containerd && alive kubelet && alive kube-proxy && alive coredns; then
    log "already running for $cluster"
    label_and_advertise kctl
    route_pods_to_apiserver "$(kctl config view --minify -o jsonpath='{.clusters[0].cluster.server}')" kctl
    return 0
  fi
  [[ -z "$current" || "$current" == "$cluster" ]] && { alive kubelet || alive containerd || alive coredns; } && cmd_down_locked

  install_packages
  check_ports
  local dns_bin
  dns_bin="$("$HERE/build-dns.sh" | tail -n 1)"
  local start=$SECONDS
  # Take the snapshot before touching anything (a leftover from a killed run was cleaned above).
  snapshot >"$SNAPSHOT"
  sysctl_dump >"$SYSCTL_BEFORE"
  : >"$CREATED_DIRS"
  local d
  for d in "${FOREIGN_DIRS[@]}"; do
    [[ -e "$d" ]] || echo "$d" >>"$CREATED_DIRS"
  done
  echo "$cluster" >"$RUN_DIR/owner"

  local server
  server="$(kctl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
  write_pki "$work/kwok/clusters/$cluster/pki"
  write_configs "$server"
  write_corefile "$kubeconfig"
  ip addr add "$NODE_IP/32" dev lo 2>/dev/null || true
  route_services_to_bridge

  # Before the kubelet: the first pods already resolve cluster names.
  start_bg coredns "$dns_bin/coredns" -conf "$VAR_DIR/Corefile"
  wait_for 60 "the cluster DNS" curl -fsS -o /dev/null "http://127.0.0.1:$DNS_READY_PORT/ready" ||
    die "CoreDNS is not ready (log: $LOG_DIR/coredns.log)"
  start_bg containerd containerd --config "$VAR_DIR/containerd.toml"
  wait_for 30 containerd ctr --address "$SOCK" version || die "containerd did not start (log: $LOG_DIR/containerd.log)"
  import_images
  start_bg kubelet "$bin/kubelet" \
    --config "$VAR_DIR/kubelet.yaml" --kubeconfig "$VAR_DIR/kubelet.kubeconfig" \
    --root-dir "$VAR_DIR/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
    --node-labels "llmop.dev/real-node=true,nvidia.com/gpu.present=true,nvidia.com/gpu.product=$GPU_PRODUCT,nvidia.com/gpu.count=$GPUS" \
    --v=1
  echo "$bin/kube-proxy" >"$RUN_DIR/kube-proxy.path"
  start_bg kube-proxy "$bin/kube-proxy" --config "$VAR_DIR/kube-proxy.yaml" --v=1
  wait_for 60 "node registration" kctl get node "$NODE_NAME" ||
    die "the kubelet did not register (log: $LOG_DIR/kubelet.log)"
  label_and_advertise kctl
  route_pods_to_apiserver "$server" kctl
  wait_for 60 "node Ready" kctl wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s ||
    die "node $NODE_NAME not Ready (log: $LOG_DIR/kubelet.log)"
  # Put back the kernel settings the kubelet changes at start (protectKernelDefaults=false): it
  # needs none of them to run pods, and the host keeps its own while the node runs. The network
  # ones (ip_forward, set by the CNI bridge) stay until `down`: pods need them.
  restore_sysctls vm.overcommit_memory kernel.panic kernel.panic_on_oops
  log "Ready in $((SECONDS - start))s (pods $POD_CIDR on $BRIDGE, logs $LOG_DIR)"
}

# The Service CIDRs go to the pods' bridge (created here; the CNI bridge plugin takes it over at
# the first pod), ahead of egress-guard.sh's `unreachable` routes: a connection from the host to
# a ClusterIP needs a route before kube-proxy's OUTPUT DNAT can send it to a pod, and this one
# keeps a ClusterIP nothing serves on this machine. Deleting the bridge (`down`) removes them.
route_services_to_bridge() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip link set "$BRIDGE" up
  local cidr
  for cidr in "$SERVICE_CIDR" "${EXTRA_SERVICE_CIDRS[@]}"; do
    ip route replace "$cidr" dev "$BRIDGE" metric 100
  done
}

# Pods reach the API server as in any cluster: in-cluster config dials the `kubernetes` Service
# (ClusterIP:443), whose endpoint the API server advertises as this node's address (cluster.sh,
# with both addresses in its certificate). The API server itself stays bound to 127.0.0.1, so
# nothing off this machine can reach it; here, packets from the pods' bridge (and the host's own,
# for hostNetwork pods) to either address are DNATed to that loopback listener. Loopback
# destinations need route_localnet, set on the pods' bridge only (never `all`), and packets that
# name 127/8 themselves are dropped unless DNATed: kube-proxy's own guard for the same setting
# (CVE-2020-8558). `down` removes the chain, the rules and the bridge with its sysctl.
APISERVER_CHAIN=LLMOP-APISERVER
route_pods_to_apiserver() { # route_pods_to_apiserver <api server url> <kctl>
  local server="$1" kctl="$2" port service
  port="${server##*:}"
  port="${port%%/*}"
  service="$("$kctl" get service kubernetes -n default -o jsonpath='{.spec.clusterIP}:{.spec.ports[0].port}')"
  sysctl -q -w "net.ipv4.conf.$BRIDGE.route_localnet=1"
  iptables -w -t nat -N "$APISERVER_CHAIN" 2>/dev/null || iptables -w -t nat -F "$APISERVER_CHAIN"
  iptables -w -t nat -A "$APISERVER_CHAIN" -d "${service%:*}/32" -p tcp --dport "${service##*:}" \
    -j DNAT --to-destination "127.0.0.1:$port"
  iptables -w -t nat -A "$APISERVER_CHAIN" -d "$NODE_IP/32" -p tcp --dport "$port" \
    -j DNAT --to-destination "127.0.0.1:$port"
  # Ahead of kube-proxy's jump, which would send the ClusterIP to the endpoint first (one DNAT per
  # connection): kube-proxy only checks that its jump exists, so it keeps the second place.
  wait_for 60 "kube-proxy's service rules" iptables -w -t nat -C PREROUTING \
    -m comment --comment "kubernetes service portals" -j KUBE-SERVICES ||
    die "kube-proxy did not install its rules (log: $LOG_DIR/kube-proxy.log)"
  iptables -w -t nat -C PREROUTING -i "$BRIDGE" -j "$APISERVER_CHAIN" 2>/dev/null ||
    iptables -w -t nat -I PREROUTING 1 -i "$BRIDGE" -j "$APISERVER_CHAIN"
  iptables -w -t nat -C OUTPUT -j "$APISERVER_CHAIN" 2>/dev/null ||
    iptables -w -t nat -I OUTPUT 1 -j "$APISERVER_CHAIN"
  iptables -w -C INPUT -i "$BRIDGE" -d 127.0.0.0/8 -m conntrack ! --ctstate DNAT -j DROP 2>/dev/null ||
    iptables -w -I INPUT 1 -i "$BRIDGE" -d 127.0.0.0/8 -m conntrack ! --ctstate DNAT -j DROP
}

# GPU capacity through the status subresource (the documented way to advertise an extended
# resource), and the fake nodes tainted so unchanged workloads land here, where they really run.
label_and_advertise() {
  local kctl="$1"
  "$kctl" patch node "$NODE_NAME" --subresource=status --type=merge \
    -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$GPUS\"},\"allocatable\":{\"nvidia.com/gpu\":\"$GPUS\"}}}" >/dev/null
  local fake
  fake="$("$kctl" get nodes -o jsonpath='{range .items[?(@.metadata.annotations.kwok\.x-k8s\.io/node=="fake")]}{.metadata.name}{"\n"}{end}')"
  if [[ -n "$fake" ]]; then
    # shellcheck disable=SC2086 # one node name per word
    "$kctl" taint nodes $fake kwok.x-k8s.io/node=fake:NoSchedule --overwrite >/dev/null
  fi
}

# Images come from e2e/images (built from the repo's Dockerfiles, cached, imported by name):
# there is no registry to pull from, so the pause image must be there before any pod.
import_images() {
  local images
  read -r -a images <<<"${LLMOP_NODE_IMAGES:-pause engine-sim}"
  log "importing images: ${images[*]} (built first when not cached)"
  "$ROOT/e2e/images/import.sh" "$SOCK" "${images[@]}" >&2 ||
    die "building/importing images (${images[*]}) into the node's containerd failed"
}

restore_sysctls() { # restore_sysctls [KEY...]: put back the stable sysctls (or just KEYs) that changed
  [[ -f "$SYSCTL_BEFORE" ]] || return 0
  local now changed key value
  now="$(sysctl_dump)"
  # Lines of the snapshot whose key still exists (an interface may be gone) with another value.
  changed="$(awk -v only=" $* " 'NR == FNR { cur[$1] = $0; next }
    ($1 in cur) && cur[$1] != $0 && (only == "  " || index(only, " " $1 " "))' \
    <(printf '%s\n' "$now") "$SYSCTL_BEFORE")"
  while IFS= read -r line; do
    [[ -n "$line" ]] || continue
    key="${line%% = *}"
    value="${line#* = }"
    log "restoring sysctl $key=$value"
    sysctl -q -w "$key=$value" >/dev/null 2>&1 || log "could not restore sysctl $key"
  done <<<"$changed"
}

# Remove every iptables rule and chain that was not in the snapshot, for IPv4 and IPv6.
restore_iptables() {
  local fam save before table line chain
  for fam in iptables ip6tables; do
    save="$("$fam-save" 2>/dev/null || true)"
    before="$(sed -n "/^## iptables/,/^## nftables/p" "$SNAPSHOT")"
    table=""
    # Rules first (they may jump to chains we delete next).
    while IFS= read -r line; do
      case "$line" in
      \*) ;;
      \**) table="${line#\*}" ;;
      -A*)
        grep -qxF -- "$line" <<<"$before" && continue
        # shellcheck disable=SC2086 # the rule's words are the arguments
        eval "$fam -w -t $table -D ${line#-A }" 2>/dev/null || true
        ;;
      esac
    done <<<"$save"
    # Then the chains: flush them all before deleting any (they may jump to each other).
    local new_chains=()
    table=""
    while IFS= read -r line; do
      case "$line" in
      \**) table="${line#\*}" ;;
      :*)
        chain="${line#:}"
        chain="${chain%% *}"
        grep -q -- "^:$chain " <<<"$before" || new_chains+=("$table $chain")
        ;;
      esac
    done <<<"$save"
    local tc
    for tc in "${new_chains[@]}"; do "$fam" -w -t "${tc% *}" -F "${tc#* }" 2>/dev/null || true; done
    for tc in "${new_chains[@]}"; do "$fam" -w -t "${tc% *}" -X "${tc#* }" 2>/dev/null || true; done
  done
  # Tables that did not exist before (e.g. created by kube-proxy's nftables probing).
  local tables_before tables_now t
  tables_before="$(sed -n "/^## nftables/,/^## sysctls/p" "$SNAPSHOT")"
  command -v nft >/dev/null || return 0
  tables_now="$(nft -s list tables 2>/dev/null || true)"
  while IFS= read -r t; do
    [[ -n "$t" ]] || continue
    grep -qxF -- "$t" <<<"$tables_before" && continue
    nft delete "${t#table }" 2>/dev/null || log "could not delete nft $t"
  done <<<"$tables_now"
}

unmount_under() { # unmount every mount point below the given paths, deepest first
  local p m
  for p in "$@"; do
    while IFS= read -r m; do
      umount -l "$m" 2>/dev/null || true
    done < <(awk -v p="$p" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | LC_ALL=C sort -r)
  done
}

remove_cgroups() { # the kubelet's pod hierarchy in every controller, leaves first
  local d
  while IFS= read -r d; do
    rmdir "$d" 2>/dev/null || true
  done < <(find /sys/fs/cgroup -depth -mindepth 2 -type d -path '*/kubepods*' 2>/dev/null)
}

cmd_down() {
  mkdir -p "$RUN_DIR" "$LOG_DIR"
  exec 8>"$LOCK"
  flock 8
  cmd_down_locked
  rmdir "$RUN_DIR" 2>/dev/null || true
}

cmd_down_locked() {
  [[ -f "$SNAPSHOT" || -d "$RUN_DIR" || -d "$VAR_DIR" ]] || return 0
  log "stopping and restoring the host"
  local t0=$SECONDS
  stop_pid kubelet 10
  # kube-proxy's own cleanup removes its chains; our restore below catches the rest.
  stop_pid kube-proxy 5
  stop_pid coredns 5
  local proxy
  proxy="$(cat "$RUN_DIR/kube-proxy.path" 2>/dev/null || true)"
  if [[ -x "$proxy" ]]; then "$proxy" --cleanup >/dev/null 2>&1 || true; fi
  if alive containerd; then
    local ids id
    ids="$(ctr_ tasks ls -q 2>/dev/null || true)"
    for id in $ids; do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 0.5
    for id in $ids; do ctr_ tasks rm -f "$id" >/dev/null 2>&1 || true; done
    ids="$(ctr_ containers ls -q 2>/dev/null || true)"
    for id in $ids; do ctr_ containers rm "$id" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd 10
  # Shims of our containerd (they outlive it by design) and anything they still run.
  local pids
  pids="$(pgrep -f "containerd-shim.*-address $SOCK" || true)"
  # shellcheck disable=SC2086
  [[ -z "$pids" ]] || kill -9 $pids 2>/dev/null || true
  unmount_under "$VAR_DIR" "$RUN_DIR" "$PERSIST/containerd" /run/netns/cni- /run/containerd
  ip link del "$BRIDGE" 2>/dev/null || true
  ip addr del "$NODE_IP/32" dev lo 2>/dev/null || true
  remove_cgroups
  if [[ -f "$SNAPSHOT" ]]; then
    restore_iptables
    restore_sysctls
  fi
  if [[ -f "$CREATED_DIRS" ]]; then
    local d
    while IFS= read -r d; do
      [[ -n "$d" ]] || continue
      # A directory we created may have become a mount point meanwhile (`ip netns add` bind-mounts
      # /run/netns onto itself and `ip netns del` leaves it): unmount it, or rm fails with EBUSY
      # and the rest of the host is never restored.
      unmount_under "$d"
      rm -rf "$d" 2>/dev/null || log "could not remove $d"
    done <"$CREATED_DIRS"
  fi
  rm -rf "$VAR_DIR"
  find "$RUN_DIR" -mindepth 1 -delete 2>/dev/null || true
  rm -f "$SNAPSHOT" "$SYSCTL_BEFORE" "$CREATED_DIRS"
  log "host restored in $((SECONDS - t0))s"
}

cmd_status() {
  local o
  o="$(owner)"
  if [[ -z "$o" ]]; then
    echo "real node: not running"
    return 1
  fi
  echo "real node: $NODE_NAME for cluster $o (ip $NODE_IP, pods $POD_CIDR, $GPUS x nvidia.com/gpu)"
  local p
  for p in containerd kubelet kube-proxy coredns; do
    if alive "$p"; then
      printf '  %-11s pid %-8s rss %s MiB\n' "$p" "$(cat "$RUN_DIR/$p.pid")" \
        "$(awk '/^VmRSS:/ { print int($2 / 1024) }' "/proc/$(cat "$RUN_DIR/$p.pid")/status")"
    else
      printf '  %-11s NOT RUNNING\n' "$p"
    fi
  done
}

case "${1:-}" in
up)
  [[ $# -eq 3 ]] || { echo "usage: $0 up <cluster-name> <cluster-work-dir>" >&2; exit 2; }
  cmd_up "$2" "$3"
  ;;
down) cmd_down ;;
status) cmd_status ;;
check)
  reason="$(why_not)"
  [[ -z "$reason" ]] || { echo "$reason"; exit 1; }
  ;;
snapshot) snapshot ;;
*)
  echo "usage: $0 up <cluster> <work-dir> | down | status | check | snapshot" >&2
  exit 2
  ;;
esac
