#!/usr/bin/env bash
# The local cluster's metrics pipeline, beside the real node: Prometheus scraping the engine pods
# the way the chart's PodMonitor describes, with the chart's alert rules loaded, and
# prometheus-adapter serving custom.metrics.k8s.io (the HPA's llmop_engine_queue_depth) with the
# chart's adapter rules. Both are host processes (no images for them here), built from Go modules
# by e2e/cluster/build-metrics.sh; their configuration is rendered from the chart by
# metrics_config.py (one source). Called by cluster.sh (up: after the real node joined; down).
#
# How the API server reaches the adapter: an APIService (v1beta1 and v1beta2 of
# custom.metrics.k8s.io) names Service llmop-monitoring/prometheus-adapter, a Service without a
# selector whose Endpoints point at the adapter's port on the real node's IP (a host address, on
# lo); the API server runs with --enable-aggregator-routing (cluster.sh), so it dials that endpoint
# instead of the ClusterIP. It authenticates with kwokctl's admin certificate
# (--proxy-client-cert-file) and the requestheader flags cluster.sh adds; the adapter learns the
# requestheader CA from kube-system/extension-apiserver-authentication. The adapter's serving
# certificate is signed by the cluster CA for the Service's DNS name, so the APIService carries the
# CA bundle (no insecureSkipTLSVerify).
#
# Usage: pipeline.sh up <work dir> <kubeconfig> <pki dir> <host ip> | down <work dir> | status <work dir>
# Environment: LLMOP_PYTHON  python with helm-python-sdk (default: <repo>/.venv/bin/python)
#              LLMOP_METRICS_QUEUE_DEPTH_INTERVAL  the chart's monitoring.podMonitor.queueDepthInterval
#                            for this Prometheus (unset: the chart's default; "": scraped with the rest)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
NS=llmop-monitoring
SVC=prometheus-adapter
PY="${LLMOP_PYTHON:-$ROOT/.venv/bin/python}"

log() { echo "metrics: $*" >&2; }

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() { # start <name> <dir> <cmd...>: detached (setsid), pid in <dir>/<name>.pid
  local name="$1" dir="$2"
  shift 2
  setsid nohup "$@" </dev/null >"$dir/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
}

wait_for() { # wait_for <what> <seconds> <cmd...>
  local what="$1" deadline=$((SECONDS + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      log "$what not ready after ${deadline}s"
      return 1
    fi
    sleep 1
  done
}

cmd_up() {
  local work="$1" kubeconfig="$2" pki="$3" host_ip="$4"
  local dir="$work/metrics" bin kubectl
  mkdir -p "$dir"
  if alive "$dir/prometheus.pid" && alive "$dir/prometheus-adapter.pid"; then
    log "already running (Prometheus http://$(cat "$dir/prometheus.addr"))"
    return 0
  fi
  cmd_down "$work"
  mkdir -p "$dir"
  [[ -x "$PY" ]] || { log "no python with the chart SDK at $PY (run 'make install')"; return 1; }
  bin="$("$ROOT/e2e/cluster/build-metrics.sh" | tail -n 1)"
  kubectl="$(cat "$work/bin-dir")/kubectl"
  local k=("$kubectl" --kubeconfig "$kubeconfig")

  local qdi=()
  [[ -n "${LLMOP_METRICS_QUEUE_DEPTH_INTERVAL+set}" ]] && qdi=(--queue-depth-interval "$LLMOP_METRICS_QUEUE_DEPTH_INTERVAL")
  "$PY" "$HERE/metrics_config.py" write --out "$dir/config" --kubeconfig "$kubeconfig" "${qdi[@]}" 2>/dev/null
  "$bin/promtool" check config "$dir/config/prometheus.yml" >&2

  local pport aport
  pport="$(free_port)"
  start prometheus "$dir" "$bin/prometheus" \
    --config.file="$dir/config/prometheus.yml" \
    --storage.tsdb.path="$dir/tsdb" \
    --storage.tsdb.retention.time=6h \
    --web.listen-address="127.0.0.1:$pport" \
    --web.enable-lifecycle
  echo "127.0.0.1:$pport" >"$dir/prometheus.addr"
  wait_for "Prometheus" 60 curl -fsS "http://127.0.0.1:$pport/-/ready"

  # The adapter's serving certificate: the cluster CA signs it for the Service's DNS names.
  local ext="subjectAltName=DNS:$SVC.$NS.svc,DNS:$SVC.$NS.svc.cluster.local,IP:$host_ip"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$dir/adapter.key" -subj "/CN=$SVC.$NS.svc" \
    -out "$dir/adapter.csr" 2>/dev/null
  printf 'keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n%s\n' "$ext" >"$dir/adapter.ext"
  openssl x509 -req -in "$dir/adapter.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -extfile "$dir/adapter.ext" -out "$dir/adapter.crt" 2>/dev/null

  aport="$(free_port)"
  start prometheus-adapter "$dir" "$bin/prometheus-adapter" \
    --prometheus-url="http://127.0.0.1:$pport" \
    --config="$dir/config/adapter.yaml" \
    --metrics-relist-interval=30s \
    --lister-kubeconfig="$kubeconfig" \
    --authentication-kubeconfig="$kubeconfig" \
    --authorization-kubeconfig="$kubeconfig" \
    --bind-address="$host_ip" \
    --secure-port="$aport" \
    --tls-cert-file="$dir/adapter.crt" \
    --tls-private-key-file="$dir/adapter.key" \
    --v=2
  echo "$host_ip:$aport" >"$dir/prometheus-adapter.addr"

  local ca manifest version priority
  ca="$(base64 -w0 "$pki/ca.crt")"
  manifest="$(cat <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $NS}
---
apiVersion: v1
kind: Service
metadata: {name: $SVC, namespace: $NS}
spec:
  ports: [{name: https, port: 443, targetPort: $aport}]
---
# The adapter is a host process: no selector, the endpoint is the host address it listens on.
apiVersion: v1
kind: Endpoints
metadata: {name: $SVC, namespace: $NS}
subsets:
- addresses: [{ip: "$host_ip"}]
  ports: [{name: https, port: $aport}]
EOF
)"
  # The adapter serves both versions of the API; the HPA controller prefers the higher priority.
  for version in v1beta1:100 v1beta2:200; do
    priority="${version#*:}" version="${version%:*}"
    manifest+="
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: $version.custom.metrics.k8s.io}
spec:
  group: custom.metrics.k8s.io
  version: $version
  service: {namespace: $NS, name: $SVC, port: 443}
  caBundle: $ca
  groupPriorityMinimum: 100
  versionPriority: $priority"
  done
  "${k[@]}" apply -f - >/dev/null 2>&1 <<<"$manifest"
  if ! wait_for "custom.metrics.k8s.io" 90 "${k[@]}" wait --for=condition=Available --timeout=5s \
    apiservice/v1beta1.custom.metrics.k8s.io apiservice/v1beta2.custom.metrics.k8s.io; then
    "${k[@]}" get apiservice v1beta1.custom.metrics.k8s.io -o yaml >&2 || true
    tail -n 30 "$dir/prometheus-adapter.log" >&2 || true
    return 1
  fi
  log "Prometheus http://127.0.0.1:$pport (targets: /api/v1/targets), prometheus-adapter https://$host_ip:$aport as custom.metrics.k8s.io"
}

cmd_down() {
  local dir="$1/metrics" f pid
  [[ -d "$dir" ]] || return 0
  for f in "$dir"/prometheus-adapter.pid "$dir"/prometheus.pid; do
    [[ -f "$f" ]] || continue
    pid="$(cat "$f")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
  done
  rm -rf "$dir"
}

cmd_status() {
  local dir="$1/metrics" f
  for f in prometheus prometheus-adapter; do
    if alive "$dir/$f.pid"; then
      printf '%-20s pid %-8s %s\n' "$f" "$(cat "$dir/$f.pid")" "$(cat "$dir/$f.addr" 2>/dev/null)"
    else
      printf '%-20s not running\n' "$f"
    fi
  done
}

case "${1:-}" in
up) shift && cmd_up "$@" ;;
down) shift && cmd_down "$@" ;;
status) shift && cmd_status "$@" ;;
*)
  echo "usage: $0 up <work> <kubeconfig> <pki> <host ip> | down <work> | status <work>" >&2
  exit 2
  ;;
esac
