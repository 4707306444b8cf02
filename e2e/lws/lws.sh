#!/usr/bin/env bash
# The LeaderWorkerSet controller (sigs.k8s.io/lws) beside the local cluster, as a host process:
# every cluster cluster.sh starts has it, so multi-node (PP > 1) LLMDeployments can be tested
# anywhere the cluster runs. Built from Go modules by e2e/cluster/build-lws.sh (there is no image
# to run here). Called by cluster.sh (up: once the control plane is up; down).
#
# Its webhooks cannot be turned off: the pod webhook sets the group labels
# (leaderworkerset.sigs.k8s.io/{group-index,worker-index,...}) and the LWS_* env the controller
# and the workers rely on, and the LWS webhook fills the defaults the controller dereferences.
# So the manager runs with its internal certificate management off (it would write a Secret and
# patch webhook configurations for an in-cluster Service) and serves its webhooks on 127.0.0.1
# with a certificate signed by a CA made here; the Mutating/ValidatingWebhookConfigurations
# (rendered from the module's own manifests by webhooks.py) point the API server at that URL.
# Every port (webhook, metrics, health) is picked free at start: several clusters run at once.
#
# Usage: lws.sh up <work dir> <kubeconfig> | down <work dir> | status <work dir>
# Environment:
#   LLMOP_PYTHON       python with PyYAML (default: <repo>/.venv/bin/python)
#   LLMOP_LWS_TIMEOUT  seconds to wait until the controller serves (default 90)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${LLMOP_PYTHON:-$ROOT/.venv/bin/python}"
TIMEOUT="${LLMOP_LWS_TIMEOUT:-90}"
CRDS=(crd/leaderworkersets.leaderworkerset.x-k8s.io crd/disaggregatedsets.disaggregatedset.x-k8s.io)

log() { echo "lws: $*" >&2; }

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Alive and ours: this VM's pid 1 reaps no orphans, so a stopped manager lingers as a zombie that
# `kill -0` still finds, and a recycled pid could name someone else's process.
alive() { # alive <pid file>
  local pid state
  [[ -f "$1" ]] || return 1
  pid="$(cat "$1")"
  state="$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" || return 1
  [[ -n "$state" && "$state" != Z && "$state" != X ]] || return 1
  [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *lws-manager* ]]
}

wait_for() { # wait_for <what> <deadline in SECONDS> <cmd...>
  local what="$1" deadline="$2"
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ! alive "$DIR/lws-manager.pid"; then
      log "$what: the manager exited"
      return 1
    fi
    if ((SECONDS > deadline)); then
      log "$what: not ready after ${TIMEOUT}s"
      return 1
    fi
    sleep 0.5
  done
}

# A server-side dry run of a LeaderWorkerSet: passes only when the API server reaches both the
# defaulting and the validating webhook over TLS and the CA bundle matches.
dry_run_lws() {
  "${K[@]}" create --dry-run=server -n default -f - <<'EOF'
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: lws-probe}
spec:
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec:
        containers: [{name: c, image: localhost/pause:3.10}]
EOF
}

fail() { # fail <message>: say why with the manager's log tail, stop it, and fail
  log "FAILED: $1; last lines of $DIR/lws-manager.log:"
  tail -n 30 "$DIR/lws-manager.log" >&2 2>/dev/null || true
  cmd_down "$WORK"
  return 1
}

cmd_up() {
  WORK="$1" DIR="$1/lws"
  local kubeconfig="$2" bin start=$SECONDS
  K=("$(cat "$WORK/bin-dir")/kubectl" --kubeconfig "$kubeconfig")
  bin="$("$ROOT/e2e/cluster/build-lws.sh" | tail -n 1)"
  if alive "$DIR/lws-manager.pid" && [[ "$(cat "$DIR/bin-dir" 2>/dev/null)" == "$bin" ]]; then
    # Re-applied: the configurations must name this manager's port, whatever happened since.
    "${K[@]}" apply -f "$DIR/webhooks.json" >/dev/null
    log "already running (webhooks https://$(cat "$DIR/webhook.addr"))"
    return 0
  fi
  cmd_down "$WORK"
  mkdir -p "$DIR/certs"
  echo "$bin" >"$DIR/bin-dir"
  [[ -x "$PY" ]] || { log "no python with PyYAML at $PY (run 'make install')"; return 1; }

  # Server-side: the LeaderWorkerSet CRD is too large for client-side apply's annotation.
  "${K[@]}" apply --server-side --force-conflicts --field-manager=llmop-lws \
    -f "$bin/config/leaderworkerset.x-k8s.io_leaderworkersets.yaml" \
    -f "$bin/config/disaggregatedset.x-k8s.io_disaggregatedsets.yaml" >/dev/null
  "$HERE/../cluster/crd-established.sh" "$TIMEOUT" "${CRDS[@]}" -- "${K[@]}"

  # A CA of this cluster's own, and the webhook server's certificate for 127.0.0.1.
  local c="$DIR/certs"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=llmop-lws-webhook-ca" -keyout "$c/ca.key" -out "$c/ca.crt" 2>/dev/null
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=127.0.0.1" -keyout "$c/tls.key" -out "$c/tls.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' >"$c/tls.ext"
  openssl x509 -req -in "$c/tls.csr" -CA "$c/ca.crt" -CAkey "$c/ca.key" -CAcreateserial \
    -days 30 -extfile "$c/tls.ext" -out "$c/tls.crt" 2>/dev/null

  local wport mport hport
  wport="$(free_port)" mport="$(free_port)" hport="$(free_port)"
  cat >"$DIR/config.yaml" <<EOF
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: $wport
  certDir: $c
metrics:
  bindAddress: 127.0.0.1:$mport
health:
  healthProbeBindAddress: 127.0.0.1:$hport
EOF
  echo "127.0.0.1:$wport" >"$DIR/webhook.addr"
  setsid nohup "$bin/lws-manager" --config="$DIR/config.yaml" --kubeconfig="$kubeconfig" \
    --leader-elect=false --zap-log-level=info </dev/null >"$DIR/lws-manager.log" 2>&1 &
  echo $! >"$DIR/lws-manager.pid"

  local deadline=$((SECONDS + TIMEOUT))
  wait_for "health endpoint" "$deadline" curl -fsS "http://127.0.0.1:$hport/readyz" ||
    { fail "no /readyz on 127.0.0.1:$hport"; return 1; }
  # Any HTTP answer over TLS verified with our CA will do: a path no webhook serves answers 404
  # quietly (an empty review to a webhook's path logs a stack trace).
  wait_for "webhook server" "$deadline" curl -sS -o /dev/null --cacert "$c/ca.crt" \
    "https://127.0.0.1:$wport/" || { fail "no webhook server on 127.0.0.1:$wport"; return 1; }
  "$PY" "$HERE/webhooks.py" "$bin/config" "$wport" "$c/ca.crt" >"$DIR/webhooks.json"
  "${K[@]}" apply -f "$DIR/webhooks.json" >/dev/null
  wait_for "webhooks through the API server" "$deadline" dry_run_lws ||
    { fail "the API server cannot use the webhooks (a dry-run LeaderWorkerSet is refused)"; return 1; }
  # The reconcilers start once the caches sync (the readiness check is a bare ping).
  wait_for "controllers" "$deadline" grep -Eq 'Starting workers.*"controller": ?"leaderworkerset"' \
    "$DIR/lws-manager.log" || { fail "the leaderworkerset controller did not start"; return 1; }
  log "LeaderWorkerSet controller ready in $((SECONDS - start))s (pid $(cat "$DIR/lws-manager.pid")," \
    "webhooks https://127.0.0.1:$wport, log $DIR/lws-manager.log)"
}

cmd_down() {
  local dir="$1/lws" pid
  [[ -d "$dir" ]] || return 0
  if alive "$dir/lws-manager.pid"; then
    pid="$(cat "$dir/lws-manager.pid")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$dir/lws-manager.pid" || break; sleep 0.1; done
    if alive "$dir/lws-manager.pid"; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -rf "$dir"
}

cmd_status() {
  local dir="$1/lws"
  if alive "$dir/lws-manager.pid"; then
    printf '%-20s pid %-8s webhooks https://%s\n' lws-manager "$(cat "$dir/lws-manager.pid")" "$(cat "$dir/webhook.addr")"
  else
    printf '%-20s not running\n' lws-manager
  fi
}

case "${1:-}" in
up) shift && cmd_up "$@" ;;
down) shift && cmd_down "$@" ;;
status) shift && cmd_status "$@" ;;
*)
  echo "usage: $0 up <work dir> <kubeconfig> | down <work dir> | status <work dir>" >&2
  exit 2
  ;;
esac
