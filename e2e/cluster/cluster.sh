#!/usr/bin/env bash
# Local Kubernetes control plane for tests and `make dev`: the real upstream
# etcd, kube-apiserver, kube-controller-manager and kube-scheduler, run as
# local processes by `kwokctl --runtime binary`, with kwok simulating the
# kubelets of a few fake GPU nodes (gpu-nodes.yaml).
#
# This is the ONE implementation: mk/cluster.mk and the pytest fixture
# (tests/support/cluster.py) both call it.
#
# Usage: e2e/cluster/cluster.sh up|down|status|kubeconfig|metrics
#   metrics  start the metrics pipeline on the running cluster (after `up` with LLMOP_METRICS=off:
#            the e2e session starts it before its first test that needs it, so the real node's
#            other tests need not wait for the pipeline's binaries)
#
# Environment:
#   LLMOP_CLUSTER_NAME       cluster name (default: llmop-dev-<hash of the clone path>)
#   LLMOP_CLUSTER_STATE      parent of the per-cluster work dirs
#                            (default: ${XDG_CACHE_HOME:-~/.cache}/llmop/clusters)
#   LLMOP_CLUSTER_OWNER_PID  if set, `up` starts a watchdog that deletes the
#                            cluster as soon as that process is gone (pytest
#                            sets it, so a killed session leaves nothing behind)
#   LLMOP_CLUSTER_TIMEOUT    seconds to wait for the cluster (default 180)
#   LLMOP_REAL_NODE          auto (default) | on | off: join a real node (node.sh: containerd +
#                            kubelet + kube-proxy running real containers) beside the kwok nodes.
#                            auto joins it when this host can run one and no other cluster holds
#                            it, and says why not otherwise; on fails instead; off never joins.
#   LLMOP_METRICS            auto (default) | on | off: start the metrics pipeline (Prometheus +
#                            prometheus-adapter as custom.metrics.k8s.io, e2e/metrics/pipeline.sh)
#                            once the real node has joined (the kwok nodes' pods export nothing).
#                            auto starts it when the real node joined and says why not otherwise;
#                            on fails instead; off does not start it (`metrics` does, later).
#   LLMOP_LWS_TIMEOUT        seconds to wait for the LeaderWorkerSet controller (default 90)
#   LLMOP_HPA_SYNC_PERIOD    kube-controller-manager's --horizontal-pod-autoscaler-sync-period
#                            (default 15s, Kubernetes' own default; a cluster setting, which
#                            `make bench-autoscale HPA_SYNC=5s` changes to show its share)
#
# Every cluster also runs the LeaderWorkerSet controller (sigs.k8s.io/lws, built by build-lws.sh)
# as a host process with its webhooks on 127.0.0.1 (e2e/lws/lws.sh): multi-node (PP > 1) serving
# needs it. It starts once the control plane is up; if it cannot, `up` fails.
#
# Every address range the cluster hands out (ranges.sh: Service CIDRs, kwok's pod CIDR, the real
# node's pods) is kept on this machine while the cluster is up: `up` registers the cluster with
# egress-guard.sh (local routes + a counting drop rule) before anything gets an address, and
# `down` unregisters it last.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

NAME="${LLMOP_CLUSTER_NAME:-llmop-dev-$(printf '%s' "$ROOT" | sha256sum | cut -c1-8)}"
STATE="${LLMOP_CLUSTER_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop/clusters}"
WORK="$STATE/$NAME"
KUBECONFIG_FILE="$WORK/kubeconfig"
TIMEOUT="${LLMOP_CLUSTER_TIMEOUT:-180}"
HPA_SYNC_PERIOD="${LLMOP_HPA_SYNC_PERIOD:-15s}"
if [[ ! "$HPA_SYNC_PERIOD" =~ ^[1-9][0-9]*s$ ]]; then
  echo "cluster: LLMOP_HPA_SYNC_PERIOD must be whole seconds like 15s (got '$HPA_SYNC_PERIOD')" >&2
  exit 2
fi
REAL_NODE="${LLMOP_REAL_NODE:-auto}"
NODE_SH="$HERE/node.sh"
METRICS="${LLMOP_METRICS:-auto}"
PIPELINE_SH="$HERE/../metrics/pipeline.sh"
LWS_SH="$HERE/../lws/lws.sh"
GUARD_SH="$HERE/egress-guard.sh"
# shellcheck source=ranges.sh
source "$HERE/ranges.sh"
# The real node's address (node.sh): a host address the API server can dial for the adapter.
NODE_IP="$REAL_NODE_IP"
# kwokctl keeps its pki, pid files, logs and etcd data under $KWOK_WORKDIR/clusters/<name>.
export KWOK_WORKDIR="$WORK/kwok"

log() { echo "cluster[$NAME]: $*" >&2; }

bin_dir() {
  if [[ -f "$WORK/bin-dir" ]]; then
    cat "$WORK/bin-dir"
  else
    "$HERE/build.sh" --print-dir
  fi
}

# Run the cluster's kubectl against the cluster's kubeconfig.
kctl() { "$(bin_dir)/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

healthy() {
  [[ -f "$KUBECONFIG_FILE" ]] && kctl get --raw /readyz >/dev/null 2>&1
}

pid_files() { compgen -G "$KWOK_WORKDIR/clusters/$NAME/pids/*.pid" || true; }

# Stop whatever kwokctl started for this cluster.  kwokctl detaches its
# processes (setsid), so nothing dies with our shell; its own `delete` reads
# the pid files, and we fall back to those same pid files if it fails.
teardown() {
  local bin
  # The LeaderWorkerSet controller's host process (it talks to the API server).
  "$LWS_SH" down "$WORK" || log "LeaderWorkerSet controller teardown failed"
  # The metrics pipeline's host processes (they scrape the node's pods).
  "$PIPELINE_SH" down "$WORK" || log "metrics pipeline teardown failed"
  # The real node first: it needs the cluster's state (and stops its pods' containers).
  if [[ "$(cat /run/llmop-node/owner 2>/dev/null || true)" == "$NAME" ]]; then
    "$NODE_SH" down || log "real node teardown failed; run '$NODE_SH down' by hand"
  fi
  bin="$(bin_dir)"
  if [[ -x "$bin/kwokctl" && -d "$KWOK_WORKDIR/clusters/$NAME" ]]; then
    "$bin/kwokctl" --name "$NAME" delete cluster --kubeconfig "$KUBECONFIG_FILE" >&2 ||
      log "kwokctl delete failed; stopping the processes from their pid files"
  fi
  local f pid
  for f in $(pid_files); do
    pid="$(cat "$f" 2>/dev/null || true)"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
    fi
  done
  if [[ -f "$WORK/watchdog.pid" ]]; then
    pid="$(cat "$WORK/watchdog.pid")"
    # Never signal ourselves: the watchdog itself runs this teardown.
    if [[ "$pid" != "$$" && "$pid" != "${WATCHDOG_SELF:-}" ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
    fi
  fi
  rm -rf "$WORK"
  # Last: until now a process of this cluster could still dial one of its ranges.
  "$GUARD_SH" down "$NAME" || log "egress guard: unregistering failed"
}

# Delete test clusters whose owning pytest process is gone (killed with -9, or
# the machine's watchdog never ran): their names are llmop-test-<pid>-<rand>.
reap_orphans() {
  local d n pid
  for d in "$STATE"/llmop-test-*; do
    [[ -d "$d" ]] || continue
    n="$(basename "$d")"
    pid="${n#llmop-test-}"
    pid="${pid%%-*}"
    if [[ "$pid" =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null; then
      log "removing orphaned test cluster $n (owner $pid is gone)"
      LLMOP_CLUSTER_NAME="$n" LLMOP_CLUSTER_OWNER_PID="" "$HERE/cluster.sh" down || true
    fi
  done
}

start_watchdog() {
  local owner="$1"
  # setsid + nohup: the watchdog must outlive the shell that started it, and
  # must not hold pytest's stdout/stderr pipes open.
  # shellcheck disable=SC2016 # the inner script expands its own positional args
  setsid nohup bash -c '
    while kill -0 "$1" 2>/dev/null; do sleep 2; done
    WATCHDOG_SELF=$$ LLMOP_CLUSTER_NAME="$2" LLMOP_CLUSTER_STATE="$3" "$4" down
  ' watchdog "$owner" "$NAME" "$STATE" "$HERE/cluster.sh" </dev/null >/dev/null 2>&1 &
  echo $! >"$WORK/watchdog.pid"
}

apply_nodes() {
  kctl apply -f "$HERE/gpu-nodes.yaml" >&2
  # A create keeps the status we send, but an apply onto an existing node
  # ignores it; (re)write capacity/allocatable through the status subresource.
  kctl apply --server-side --force-conflicts --field-manager=llmop-cluster \
    --subresource=status -f "$HERE/gpu-nodes.yaml" >/dev/null
}

wait_ready() {
  local deadline=$((SECONDS + TIMEOUT))
  until kctl wait --for=condition=Ready node --all --timeout=5s >/dev/null 2>&1 &&
    kctl get serviceaccount default -n default >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      log "nodes not Ready / default ServiceAccount missing after ${TIMEOUT}s"
      kctl get nodes -o wide >&2 || true
      return 1
    fi
    sleep 1
  done
}

# kwokctl's config: the static options plus per-cluster component flags (paths into this
# cluster's pki). Flags go here, not in repeated --extra-args: kwokctl 0.8.0 indexes its patch
# list by flag position and panics when a component's flags follow another component's.
kwokctl_config() { # kwokctl_config <pki dir>: print it
  local pki="$1"
  cat "$HERE/kwokctl.yaml"
  cat <<EOF
  # In-cluster clients verify the API server as the kubernetes Service's ClusterIP or as its
  # endpoint (the advertise-address below); kwokctl adds these to the host's own addresses.
  kubeApiserverCertSANs: ["$KUBERNETES_SERVICE_IP", "$REAL_NODE_IP"]
componentsPatches:
- name: etcd
  extraArgs:
  - {key: unsafe-no-fsync, value: "true"}
- name: kube-apiserver
  extraArgs:
  # Pinned (the API server's default), so ranges.sh names it; kept local by egress-guard.sh.
  - {key: service-cluster-ip-range, value: "$SERVICE_CIDR"}
  # The kubernetes Service's endpoint: the real node's address, which its pods can route to
  # (node.sh forwards it, from the pods' bridge only, to this loopback-bound API server).
  - {key: advertise-address, value: "$REAL_NODE_IP"}
  # The real node (node.sh) registers with an IP only, and verifies the API server's client cert.
  - {key: kubelet-preferred-address-types, value: InternalIP}
  - {key: kubelet-client-certificate, value: "$pki/admin.crt"}
  - {key: kubelet-client-key, value: "$pki/admin.key"}
  - {key: kubelet-certificate-authority, value: "$pki/ca.crt"}
  # Aggregated APIs (prometheus-adapter, e2e/metrics/pipeline.sh): dial the APIService's endpoint,
  # a host address, not its ClusterIP; kwokctl already presents its admin cert as the front proxy
  # (--proxy-client-cert-file), so trust exactly that identity's X-Remote-* headers.
  - {key: enable-aggregator-routing, value: "true"}
  - {key: requestheader-client-ca-file, value: "$pki/ca.crt"}
  - {key: requestheader-allowed-names, value: kwok-admin}
  - {key: requestheader-username-headers, value: X-Remote-User}
  - {key: requestheader-group-headers, value: X-Remote-Group}
  - {key: requestheader-extra-headers-prefix, value: X-Remote-Extra-}
# One instance each, so no leader election: when a real vLLM engine saturates both cores, a
# lease renewal can miss its 5 s deadline, and a controller that loses its lease exits for good
# (the controller-manager did mid-run: no ServiceAccounts, every later test failed).
- name: kube-controller-manager
  extraArgs:
  - {key: leader-elect, value: "false"}
  - {key: horizontal-pod-autoscaler-sync-period, value: "$HPA_SYNC_PERIOD"}
- name: kube-scheduler
  extraArgs:
  - {key: leader-elect, value: "false"}
- name: kwok-controller
  extraArgs:
  # kwok plays the kubelet only for the fake nodes, never for the real one.
  - {key: manage-all-nodes, value: "false"}
  - {key: manage-nodes-with-annotation-selector, value: kwok.x-k8s.io/node=fake}
  # The fake pods' addresses: a range of their own (kwok's default is the Service CIDR), routed
  # unreachable by egress-guard.sh, so a read of a fake pod fails at once, on this machine.
  - {key: cidr, value: "$KWOK_POD_CIDR"}
EOF
}

join_real_node() {
  case "$REAL_NODE" in
  off)
    log "real node: off (LLMOP_REAL_NODE=off)"
    return 0
    ;;
  on | auto) ;;
  *)
    log "LLMOP_REAL_NODE must be auto, on or off (got '$REAL_NODE')"
    return 1
    ;;
  esac
  local why owner
  if ! why="$("$NODE_SH" check)"; then
    [[ "$REAL_NODE" == on ]] && { log "real node: cannot run here: $why"; return 1; }
    log "real node: NOT joined ($why); pods run only on kwok's fake nodes (set LLMOP_REAL_NODE=off to silence)"
    return 0
  fi
  owner="$(cat /run/llmop-node/owner 2>/dev/null || true)"
  if [[ -n "$owner" && "$owner" != "$NAME" && -d "$STATE/$owner" && "$REAL_NODE" == auto ]]; then
    log "real node: NOT joined (cluster '$owner' holds this machine's real node; one per machine)"
    return 0
  fi
  "$NODE_SH" up "$NAME" "$WORK" || {
    log "real node: failed to join (see the lines above)"
    # Clean up only a node this cluster owns (or a half-started one nobody owns): when another
    # live cluster holds it, `node.sh up` refused and a `down` here would kill that cluster's node
    # under its running tests.
    owner="$(cat /run/llmop-node/owner 2>/dev/null || true)"
    if [[ -z "$owner" || "$owner" == "$NAME" ]]; then
      "$NODE_SH" down || true
    fi
    return 1
  }
}

start_metrics() {
  case "$METRICS" in
  off) return 0 ;;
  on | auto) ;;
  *)
    log "LLMOP_METRICS must be auto, on or off (got '$METRICS')"
    return 1
    ;;
  esac
  if [[ "$(cat /run/llmop-node/owner 2>/dev/null || true)" != "$NAME" ]]; then
    # Asked for no real node (the integration tests): nothing to say.
    [[ "$REAL_NODE" == off && "$METRICS" == auto ]] && return 0
    [[ "$METRICS" == on ]] && { log "metrics pipeline: needs the real node, which is not joined"; return 1; }
    log "metrics pipeline: NOT started (no real node joined: nothing to scrape)"
    return 0
  fi
  "$PIPELINE_SH" up "$WORK" "$KUBECONFIG_FILE" "$KWOK_WORKDIR/clusters/$NAME/pki" "$NODE_IP" || {
    log "metrics pipeline: FAILED to start (see the lines above)"
    "$PIPELINE_SH" down "$WORK" || true
    # auto: the cluster and its real node are still useful without it; on: fail.
    [[ "$METRICS" == auto ]]
  }
}

start_lws() {
  "$LWS_SH" up "$WORK" "$KUBECONFIG_FILE" || {
    log "LeaderWorkerSet controller: FAILED to start (see the lines above)"
    return 1
  }
}

cmd_up() {
  mkdir -p "$STATE"
  reap_orphans
  local bin
  bin="$("$HERE/build.sh" | tail -n 1)"
  # Built (or reused) before the control plane starts, so a cold build never runs beside it.
  "$HERE/build-lws.sh" >/dev/null
  # kwokctl writes the cluster CA and its admin cert here before it starts the API server, which
  # presents that cert to kubelets (the real node trusts the CA); kwok manages only the fake nodes.
  local pki="$KWOK_WORKDIR/clusters/$NAME/pki" config
  config="$(kwokctl_config "$pki")"
  if [[ -d "$WORK" ]]; then
    # A cluster made from other binaries or another config (say, before a flag was added) is
    # recreated, not reused.
    if [[ "$(cat "$WORK/bin-dir" 2>/dev/null)" == "$bin" && "$(cat "$WORK/kwokctl.yaml" 2>/dev/null)" == "$config" ]] && healthy; then
      log "already running"
      "$GUARD_SH" up "$NAME" "$WORK"
      apply_nodes
      wait_ready
      start_lws
      join_real_node
      start_metrics
      echo "$KUBECONFIG_FILE"
      return 0
    fi
    log "stale or unhealthy cluster state; recreating"
    teardown
  fi
  mkdir -p "$WORK"
  echo "$bin" >"$WORK/bin-dir"
  # Before any component starts: from the first pod on, its address must stay local.
  "$GUARD_SH" up "$NAME" "$WORK"
  if [[ -n "${LLMOP_CLUSTER_OWNER_PID:-}" ]]; then
    start_watchdog "$LLMOP_CLUSTER_OWNER_PID"
  fi
  local k8s_version start=$SECONDS
  printf '%s\n' "$config" >"$WORK/kwokctl.yaml"
  k8s_version="$("$bin/kubectl" version --client -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p')"
  log "creating (kubernetes $k8s_version, binaries from $bin)"
  # kwokctl picks each component's port by scanning down from 32767 for one nothing listens on
  # yet, so two creates at once (the two test lanes start together) pick the same ports and one
  # cluster's kubectl talks to the other's API server (seen: "x509: certificate signed by unknown
  # authority"). Creates take turns; the lock is this shell's alone (fd 7 closed for kwokctl,
  # whose detached components would otherwise hold it for the cluster's life).
  exec 7>"$STATE/kwokctl-create.lock"
  flock 7
  # Every component comes from $bin: kwokctl must never download anything.
  # kubectl is found first on PATH (and KWOK_KUBECTL_BINARY as a fallback).
  # The optional components that it would fetch (metrics-server, prometheus,
  # jaeger, dashboard) are off by default; --components pins the set anyway.
  PATH="$bin:$PATH" \
    KWOK_KUBE_VERSION="$k8s_version" \
    KWOK_KUBE_BINARY_PREFIX="$bin" \
    KWOK_KUBECTL_BINARY="$bin/kubectl" \
    "$bin/kwokctl" --name "$NAME" create cluster \
    --config "$WORK/kwokctl.yaml" \
    --runtime binary \
    --components etcd,kube-apiserver,kube-controller-manager,kube-scheduler,kwok-controller \
    --etcd-binary "$bin/etcd" \
    --kube-apiserver-binary "$bin/kube-apiserver" \
    --kube-controller-manager-binary "$bin/kube-controller-manager" \
    --kube-scheduler-binary "$bin/kube-scheduler" \
    --kwok-controller-binary "$bin/kwok" \
    --kubeconfig "$KUBECONFIG_FILE" \
    --disable-qps-limits \
    --timeout "${TIMEOUT}s" \
    --wait "${TIMEOUT}s" >&2 7>&- || {
    exec 7>&-
    log "kwokctl create failed"
    teardown
    return 1
  }
  exec 7>&-
  # kwokctl names the context kwok-<name>; make it the file's default.
  kctl config use-context "kwok-$NAME" >/dev/null
  apply_nodes
  wait_ready
  start_lws
  join_real_node
  start_metrics
  log "ready in $((SECONDS - start))s; kubeconfig: $KUBECONFIG_FILE"
  echo "$KUBECONFIG_FILE"
}

cmd_down() {
  if [[ ! -d "$WORK" ]]; then
    log "not running"
    return 0
  fi
  log "deleting"
  teardown
}

cmd_metrics() {
  healthy || { log "not running: start it with up first"; return 1; }
  METRICS=on start_metrics
}

cmd_status() {
  if [[ ! -d "$WORK" ]]; then
    log "not running (state dir $WORK absent)"
    return 1
  fi
  echo "name:       $NAME"
  echo "kubeconfig: $KUBECONFIG_FILE"
  echo "binaries:   $(bin_dir)"
  if ! healthy; then
    echo "apiserver:  NOT READY"
    return 1
  fi
  echo "version:    $(kctl version -o json | sed -n '/serverVersion/,$ s/.*"gitVersion": "\([^"]*\)".*/\1/p')"
  echo
  "$NODE_SH" status 2>/dev/null || true
  echo
  "$PIPELINE_SH" status "$WORK" || true
  "$LWS_SH" status "$WORK" || true
  echo
  kctl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count \
    -o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GPU:.status.allocatable.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product'
  echo
  local f pid total=0 rss
  printf '%-28s %8s %10s\n' PROCESS PID RSS_MIB
  # The LeaderWorkerSet controller is one of the cluster's processes too.
  for f in $(pid_files) $(compgen -G "$WORK/lws/lws-manager.pid" || true); do
    pid="$(cat "$f")"
    rss="$(awk '/^VmRSS:/ { print int($2 / 1024) }' "/proc/$pid/status" 2>/dev/null || echo 0)"
    total=$((total + rss))
    printf '%-28s %8s %10s\n' "$(basename "$f" .pid)" "$pid" "$rss"
  done
  printf '%-28s %8s %10s\n' total "" "$total"
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
kubeconfig) echo "$KUBECONFIG_FILE" ;;
metrics) cmd_metrics ;;
*)
  echo "usage: $0 up|down|status|kubeconfig|metrics" >&2
  exit 2
  ;;
esac
