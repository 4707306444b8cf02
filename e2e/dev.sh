#!/usr/bin/env bash
# `make dev` / `make dev-down`: the whole stack on the local cluster, from a fresh clone.
#
#   up    start (or reuse) the local cluster with its real node (e2e/cluster/node.sh), install
#         the CRD from crds/, (re)start the operator (`llmop run`, a local process using the
#         cluster's admin kubeconfig, with the settings the Helm chart gives it by default), apply
#         the simulator-backend samples from examples/, wait until they are Ready, show them,
#         and send one completion through the sample's Service (its ClusterIP, via kube-proxy).
#   down  stop the operator (or uninstall the release) and delete the local cluster.
#
# LLMOP_OPERATOR=pod: instead of a local process, the operator is what users install: the chart
# (helm/llmop, release `llmop` in namespace llmop-system, Pod Security `restricted`) with the
# operator and router images built from this checkout and imported into the real node, so the
# operator runs as two pods that reach the API server in-cluster, and the router pods answer
# for every sample. The chart owns the CRD in that mode.
#
# Idempotent: `up` twice reuses the running cluster and restarts the operator on the current
# code. Nothing is written into the clone: the operator's pid file and log live in the
# cluster's state directory (~/.cache/llmop/clusters/<name>/), which `down` removes.
#
# Environment: VENV (default .venv), LLMOP_OPERATOR (process | pod, default process),
# LLMOP_DEV_TIMEOUT (seconds to wait for Ready, default 180), and the cluster's own
# LLMOP_CLUSTER_* variables (e2e/cluster/cluster.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER_SH="$ROOT/e2e/cluster/cluster.sh"
VENV="${VENV:-$ROOT/.venv}"
[[ "$VENV" = /* ]] || VENV="$ROOT/$VENV"
PY="$VENV/bin/python"
TIMEOUT="${LLMOP_DEV_TIMEOUT:-180}"
MODE="${LLMOP_OPERATOR:-process}"
RELEASE=llmop
RELEASE_NAMESPACE=llmop-system
NODE_CONTAINERD=/run/llmop-node/containerd/containerd.sock

log() { echo "dev: $*" >&2; }

state_dir() { dirname "$("$CLUSTER_SH" kubeconfig)"; }

stop_operator() {
  local pidfile
  pidfile="$(state_dir)/operator.pid"
  [[ -f "$pidfile" ]] || return 0
  local pid
  pid="$(cat "$pidfile")"
  # Only signal the process we started: its command line must be our `llmop run`.
  if kill -0 "$pid" 2>/dev/null && grep -qa "llmop" "/proc/$pid/cmdline" 2>/dev/null; then
    log "stopping the operator (pid $pid)"
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

# The operator's LLMOP_* settings as the chart's default values render them (helm/llmop), so the
# dev operator behaves like the installed one; ports are chosen here instead.
chart_env() {
  "$PY" - "$ROOT/helm/llmop" <<'EOF'
import shlex, sys, yaml
import helm_python as helm
out = helm.Chart.load(sys.argv[1]).render({}, name="llmop", namespace="llmop-system")
for path, text in out.items():
    if not path.endswith((".yaml", ".yml")):
        continue
    for doc in yaml.safe_load_all(text):
        if not doc or doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env") or []:
                if "value" in e and e["name"] not in {"LLMOP_LIVENESS_PORT", "LLMOP_METRICS_PORT"}:
                    print(f"{e['name']}={shlex.quote(str(e['value']))}")
EOF
}

# `release install|uninstall|status <kubeconfig>`: install or upgrade the chart as release llmop
# (default values except the images' pull policy: they are imported, never pulled); remove it
# when present; print "installed" when it is.
release() {
  "$PY" - "$1" "$2" "$ROOT/helm/llmop" "$RELEASE" "$RELEASE_NAMESPACE" <<'EOF'
import sys
import helm_python as helm
action, kubeconfig, chart, name, namespace = sys.argv[1:]
values = {"image": {"pullPolicy": "Never"}, "router": {"image": {"pullPolicy": "Never"}}}
with helm.Config(kubeconfig_path=kubeconfig, namespace=namespace) as config:
    try:
        config.status(name)
        installed = True
    except helm.HelmNotFoundError:
        installed = False
    if action == "status":
        print("installed" if installed else "")
    elif action == "uninstall":
        if installed:
            config.uninstall(name, wait="watcher", timeout=120)
    elif installed:
        config.upgrade(chart, name, values, namespace=namespace, wait="watcher", timeout=300)
    else:
        config.install(chart, name, values, namespace=namespace, wait="watcher", timeout=300)
EOF
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Simulator-backend samples only (the others need real GPUs and model credentials), one
# "<file> <namespace> <name>" line per LLMDeployment.
simulator_examples() {
  "$PY" - "$ROOT/examples" <<'EOF'
import pathlib, sys, yaml
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.yaml")):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    sim = [d for d in docs if d.get("kind") == "LLMDeployment"
           and (d.get("spec") or {}).get("engine", {}).get("backend") == "simulator"]
    if sim and len(sim) == len(docs):
        for d in sim:
            print(path, d["metadata"].get("namespace", "default"), d["metadata"]["name"])
EOF
}

cmd_up() {
  [[ -x "$PY" ]] || { log "no virtualenv at $VENV: run 'make dev' (it runs 'make install' first)"; exit 1; }
  local start=$SECONDS kubeconfig work bin
  log "starting the local cluster (the first run builds Kubernetes from source: 20-40 min on 2 cores)"
  kubeconfig="$("$CLUSTER_SH" up | tail -n 1)"
  work="$(dirname "$kubeconfig")"
  bin="$(cat "$work/bin-dir")"
  kctl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

  local operator_info
  case "$MODE" in
  process) start_operator ;;
  pod) install_release ;;
  *)
    log "LLMOP_OPERATOR must be process or pod (got '$MODE')"
    exit 2
    ;;
  esac
  samples_up
}

# The chart's release instead of a local process (LLMOP_OPERATOR=pod).
install_release() {
  stop_operator
  [[ "$(cat /run/llmop-node/owner 2>/dev/null || true)" == "$(basename "$work")" ]] ||
    { log "LLMOP_OPERATOR=pod needs the real node, which did not join (see the cluster log above)"; exit 1; }
  log "building (or reusing) the operator and router images; importing them into the node"
  "$PY" "$ROOT/e2e/images/images.py" import --address "$NODE_CONTAINERD" operator router >/dev/null
  kctl create namespace "$RELEASE_NAMESPACE" --dry-run=client -o yaml | kctl apply -f - >/dev/null
  kctl label --overwrite namespace "$RELEASE_NAMESPACE" \
    pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest >/dev/null
  local crd=llmdeployments.serving.llmop.dev
  if kctl get crd "$crd" >/dev/null 2>&1; then
    # Applied by a process-mode run: Helm adopts it only with the release's ownership metadata.
    kctl label --overwrite crd "$crd" app.kubernetes.io/managed-by=Helm >/dev/null
    kctl annotate --overwrite crd "$crd" "meta.helm.sh/release-name=$RELEASE" \
      "meta.helm.sh/release-namespace=$RELEASE_NAMESPACE" >/dev/null
  fi
  log "helm install (or upgrade) of helm/llmop as $RELEASE_NAMESPACE/$RELEASE; waiting for its pods"
  release install "$kubeconfig"
  "$ROOT/e2e/cluster/crd-established.sh" 60 "crd/$crd" -- "$bin/kubectl" --kubeconfig "$kubeconfig"
  kctl get pods -n "$RELEASE_NAMESPACE" -o wide >&2
  operator_info="Operator: release $RELEASE_NAMESPACE/$RELEASE (kubectl logs -n $RELEASE_NAMESPACE deploy/$RELEASE;
  kubectl get lease -n $RELEASE_NAMESPACE llmop-operator names the leader)"
}

# `llmop run` as a local process with the cluster's admin kubeconfig.
start_operator() {
  if [[ -n "$(release status "$kubeconfig")" ]]; then
    log "uninstalling the chart's release (from LLMOP_OPERATOR=pod): a local process replaces it"
    release uninstall "$kubeconfig"
  fi
  log "installing the LLMDeployment CRD (crds/)"
  kctl apply --server-side --force-conflicts --field-manager=llmop-dev -f "$ROOT/crds/" >&2
  "$ROOT/e2e/cluster/crd-established.sh" 60 crd/llmdeployments.serving.llmop.dev -- \
    "$bin/kubectl" --kubeconfig "$kubeconfig"

  stop_operator
  local liveness metrics
  liveness="$(free_port)"
  metrics="$(free_port)"
  log "starting the operator (log: $work/operator.log)"
  # setsid + nohup: the operator outlives `make dev`; stdin/stdout detached from the terminal.
  local settings
  settings="$(chart_env)"
  # One NAME=value word per line, each value quoted by the renderer (shlex.quote). `exec`: the
  # background subshell becomes the operator (setsid does not fork outside a process-group
  # leader), so $! is the operator's PID; without it the pidfile held the subshell's, and
  # `make dev-down` left the operator running.
  eval "exec env $(tr '\n' ' ' <<<"$settings")" \
    KUBECONFIG="$kubeconfig" LLMOP_LOG_FORMAT=text LLMOP_BIND_ADDRESS=127.0.0.1 \
    LLMOP_LIVENESS_PORT="$liveness" LLMOP_METRICS_PORT="$metrics" \
    setsid nohup "$VENV/bin/llmop" run </dev/null >>"$work/operator.log" 2>&1 &
  echo $! >"$work/operator.pid"
  echo "$liveness $metrics" >"$work/operator.ports"
  local deadline=$((SECONDS + 60))
  until "$PY" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$liveness/healthz', timeout=2)" 2>/dev/null; do
    if ! kill -0 "$(cat "$work/operator.pid")" 2>/dev/null || ((SECONDS > deadline)); then
      log "the operator did not come up; last log lines:"
      tail -n 40 "$work/operator.log" >&2
      exit 1
    fi
    sleep 0.5
  done
  operator_info="Operator: log $work/operator.log, metrics http://127.0.0.1:$metrics/metrics"
}

samples_up() {
  local samples line file ns name
  mapfile -t samples < <(simulator_examples)
  ((${#samples[@]})) || { log "no simulator-backend samples in examples/"; exit 1; }
  for line in "${samples[@]}"; do
    read -r file ns name <<<"$line"
    log "applying ${file#"$ROOT/"} ($ns/$name)"
    kctl apply --server-side --field-manager=llmop-dev -f "$file" >/dev/null
  done
  log "waiting for the LLMDeployments to become Ready (up to ${TIMEOUT}s)"
  for line in "${samples[@]}"; do
    read -r file ns name <<<"$line"
    if ! kctl wait -n "$ns" "llmdeployment/$name" --for=condition=Ready --timeout="${TIMEOUT}s" >/dev/null; then
      log "$ns/$name is not Ready; its conditions:"
      kctl get llmdeployment -n "$ns" "$name" \
        -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2
      exit 1
    fi
  done
  echo
  kctl get llmd -A
  local real_node=0 first_ns first_name svc_ip url router_url
  [[ "$(cat /run/llmop-node/owner 2>/dev/null || true)" == "$(basename "$work")" ]] && real_node=1
  read -r _ first_ns first_name <<<"${samples[0]}"
  svc_ip="$(kctl get service -n "$first_ns" "$first_name" -o jsonpath='{.spec.clusterIP}')"
  url="http://$svc_ip:8000/v1/completions"
  if ((real_node)); then
    echo
    kctl get pods -n "$first_ns" -l "serving.llmop.dev/deployment=$first_name" -o wide
    echo
    echo "One completion through the Service (ClusterIP $svc_ip, routed by kube-proxy):"
    local body="{\"model\": \"$first_name\", \"prompt\": \"Hello\", \"max_tokens\": 12}"
    echo "\$ curl -sS $url -H 'Content-Type: application/json' -d '$body'"
    curl -sS "$url" -H 'Content-Type: application/json' -d "$body" || { log "the completion failed"; exit 1; }
    echo
    if [[ "$MODE" == pod ]]; then
      router_url="http://$(kctl get service -n "$RELEASE_NAMESPACE" "$RELEASE-router" -o jsonpath='{.spec.clusterIP}'):8080/v1/completions"
      echo
      echo "And through the router (one OpenAI endpoint for every LLMDeployment):"
      echo "\$ curl -sS $router_url -H 'Content-Type: application/json' -d '$body'"
      local tries=0
      until curl -sSf "$router_url" -H 'Content-Type: application/json' -d "$body"; do
        # The router lists a model once its endpoints are ready in the router's own watch.
        ((++tries < 20)) || { log "the completion through the router failed"; exit 1; }
        sleep 1
      done
      echo
    fi
  else
    log "WARNING: no real node joined (see the cluster log above): the pods run on kwok's fake"
    log "nodes, which start no containers, so nothing answers requests"
  fi
  cat <<EOF

llmop dev environment is up ($((SECONDS - start))s). To use it from this shell:
  export KUBECONFIG=$kubeconfig
  export PATH=$bin:\$PATH
  kubectl get llmd -A                      # the LLMDeployments (short name llmd)
  kubectl describe llmd qwen-small         # conditions, capacity plan, events
  curl -sS $url -H 'Content-Type: application/json' \\
    -d '{"model": "$first_name", "prompt": "Hello", "max_tokens": 12}'
$operator_info
Stop everything: make dev-down
EOF
}

cmd_down() {
  stop_operator
  local kubeconfig
  kubeconfig="$("$CLUSTER_SH" kubeconfig)"
  if [[ -f "$kubeconfig" ]] && "$CLUSTER_SH" status >/dev/null 2>&1 && [[ -n "$(release status "$kubeconfig")" ]]; then
    log "helm uninstall $RELEASE_NAMESPACE/$RELEASE"
    release uninstall "$kubeconfig"
  fi
  "$CLUSTER_SH" down
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
*)
  echo "usage: $0 up|down" >&2
  exit 2
  ;;
esac
