#!/usr/bin/env bash
# `make dev` / `make dev-down`: the whole stack on the local cluster, from a fresh clone.
#
#   up    start (or reuse) the local cluster with its real node (e2e/cluster/node.sh), install
#         the CRD from crds/, start the chart's router as pods (its image built from this
#         checkout and imported into the node; the chart's router objects in llmop-system),
#         (re)start the operator (`llmop run`, a local process using the cluster's admin
#         kubeconfig, with the settings the Helm chart gives it by default), apply the
#         simulator-backend samples from examples/, wait until they are Ready with no Degraded
#         condition, show them, and send one completion through the router (the samples'
#         endpoint) and one through the sample's own Service (its ClusterIP, via kube-proxy).
#   down  stop the operator (or uninstall the release) and delete the local cluster.
#   stop  stop the operator and delete the samples and the router objects; keep the cluster.
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
# LLMOP_DEV_TIMEOUT (seconds to wait for Ready, default 180), LLMOP_DEV_KUBECONFIG (a local
# cluster that e2e/cluster/cluster.sh already started, used as it is: the e2e test of this
# script), and the cluster's own LLMOP_CLUSTER_* variables (e2e/cluster/cluster.sh).
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

cluster_kubeconfig() {
  if [[ -n "${LLMOP_DEV_KUBECONFIG:-}" ]]; then echo "$LLMOP_DEV_KUBECONFIG"; else "$CLUSTER_SH" kubeconfig; fi
}

state_dir() { dirname "$(cluster_kubeconfig)"; }

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
values = {
    "image": {"pullPolicy": "Never"},
    "router": {
        "image": {"pullPolicy": "Never"},
        "gateway": {"store": {"image": {"pullPolicy": "Never"}}},
    },
}
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

# The chart's router objects (templates/router.yaml and its gateway's store, router-store.yaml;
# default values but the images' pull policy: they are imported, never pulled) as one YAML stream, with Helm's ownership annotations of
# release llmop, so a later LLMOP_OPERATOR=pod run's `helm install` adopts them.
router_objects() {
  "$PY" - "$ROOT/helm/llmop" "$RELEASE" "$RELEASE_NAMESPACE" <<'EOF'
import sys, yaml
import helm_python as helm
chart, name, namespace = sys.argv[1:]
values = {
    "router": {
        "image": {"pullPolicy": "Never"},
        "gateway": {"store": {"image": {"pullPolicy": "Never"}}},
    }
}
out = helm.Chart.load(chart).render(values, name=name, namespace=namespace)
docs = []
for path, text in sorted(out.items()):
    if not path.endswith(("/templates/router.yaml", "/templates/router-store.yaml")):
        continue
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        notes = doc["metadata"].setdefault("annotations", {})
        notes["meta.helm.sh/release-name"] = name
        notes["meta.helm.sh/release-namespace"] = namespace
        docs.append(doc)
if not docs:
    sys.exit("the chart rendered no router objects (templates/router.yaml)")
print(yaml.safe_dump_all(docs, sort_keys=False))
EOF
}

# The router as pods, as the chart runs them: every routed sample's endpoint names their Service
# (llmop-router.llmop-system:8080), and they wake models scaled to zero.
start_router() {
  log "building (or reusing) the router and its store's images; importing them into the node"
  "$PY" "$ROOT/e2e/images/images.py" import --address "$NODE_CONTAINERD" router redis >/dev/null
  release_namespace
  log "starting the router pods ($RELEASE_NAMESPACE/$RELEASE-router: the chart's router objects)"
  local existed=0
  kctl get -n "$RELEASE_NAMESPACE" "deployment/$RELEASE-router" >/dev/null 2>&1 && existed=1
  router_objects | kctl apply --server-side --force-conflicts --field-manager=llmop-dev -f - >/dev/null
  # The image may be new under the same tag (this checkout changed): running pods keep the old.
  ((existed)) && kctl rollout restart -n "$RELEASE_NAMESPACE" "deployment/$RELEASE-router" >/dev/null
  # The store first: until it answers, the routers admit by their share of each limit.
  kctl rollout status -n "$RELEASE_NAMESPACE" "deployment/$RELEASE-router-store" --timeout=120s >&2 ||
    log "the gateway's store is not ready yet: the routers admit by their share meanwhile"
  if ! kctl rollout status -n "$RELEASE_NAMESPACE" "deployment/$RELEASE-router" --timeout=120s >&2; then
    log "the router pods did not become ready; their state and log:"
    kctl get pods -n "$RELEASE_NAMESPACE" -o wide >&2 || true
    kctl logs -n "$RELEASE_NAMESPACE" "deployment/$RELEASE-router" --tail=40 >&2 || true
    exit 1
  fi
}

# The gateway's dev tenant: one key per local cluster, made once and kept in the cluster's state
# directory (mode 0600; `down` removes it), its SHA-256 in `LLMTenant dev` (every model).
dev_tenant() {
  local key_file="$work/dev-api-key" digest
  if [[ ! -s "$key_file" ]]; then
    (umask 077 && "$PY" -c 'import secrets; print("llmop_" + secrets.token_urlsafe(32))' >"$key_file")
  fi
  digest="$(tr -d '\n' <"$key_file" | sha256sum | cut -d' ' -f1)"
  log "applying LLMTenant dev (its key: $key_file)"
  kctl apply --server-side --force-conflicts --field-manager=llmop-dev -f - >/dev/null <<YAML
apiVersion: serving.llmop.dev/v1alpha1
kind: LLMTenant
metadata:
  name: dev
spec:
  models: ["*"]
  apiKeys:
    - name: make-dev
      sha256: $digest
YAML
  dev_key="$(cat "$key_file")"
}

# The release's namespace, enforcing Pod Security `restricted` as an installation should.
release_namespace() {
  kctl create namespace "$RELEASE_NAMESPACE" --dry-run=client -o yaml | kctl apply -f - >/dev/null
  kctl label --overwrite namespace "$RELEASE_NAMESPACE" \
    pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest >/dev/null
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
  if [[ -n "${LLMOP_DEV_KUBECONFIG:-}" ]]; then
    log "using the running local cluster of $LLMOP_DEV_KUBECONFIG"
    kubeconfig="$LLMOP_DEV_KUBECONFIG"
  else
    log "starting the local cluster (the first run builds Kubernetes from source: 20-40 min on 2 cores)"
    kubeconfig="$("$CLUSTER_SH" up | tail -n 1)"
  fi
  work="$(dirname "$kubeconfig")"
  bin="$(cat "$work/bin-dir")"
  kctl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

  local operator_info real_node=0
  [[ "$(cat /run/llmop-node/owner 2>/dev/null || true)" == "$(basename "$work")" ]] && real_node=1
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
  log "building (or reusing) the operator, router and store images; importing them into the node"
  "$PY" "$ROOT/e2e/images/images.py" import --address "$NODE_CONTAINERD" operator router redis >/dev/null
  release_namespace
  local crd=llmdeployments.serving.llmop.dev adopted
  for adopted in "$crd" llmtenants.serving.llmop.dev llmpriorityclasses.serving.llmop.dev \
    llmexternalmodels.serving.llmop.dev; do
    if kctl get crd "$adopted" >/dev/null 2>&1; then
      # Applied by a process-mode run: Helm adopts it only with the release's ownership metadata.
      kctl label --overwrite crd "$adopted" app.kubernetes.io/managed-by=Helm >/dev/null
      kctl annotate --overwrite crd "$adopted" "meta.helm.sh/release-name=$RELEASE" \
        "meta.helm.sh/release-namespace=$RELEASE_NAMESPACE" >/dev/null
    fi
  done
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
  local settings
  settings="$(chart_env)"
  if ((real_node)); then
    start_router
  else
    # Without the real node no router pod can run: the samples' endpoint is their own Service.
    settings="$(grep -v '^LLMOP_ROUTER=' <<<"$settings" || true)"
  fi
  local liveness metrics
  liveness="$(free_port)"
  metrics="$(free_port)"
  log "starting the operator (log: $work/operator.log)"
  # setsid + nohup: the operator outlives `make dev`; stdin/stdout detached from the terminal.
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
  log "waiting for the LLMDeployments to become Ready with no problem reported (up to ${TIMEOUT}s)"
  local report=()
  if ((real_node)); then report=(--engines-report); fi
  for line in "${samples[@]}"; do
    read -r file ns name <<<"$line"
    # Where the pods really run, their engines' KV capacity must also have been read back.
    if ! "$PY" "$ROOT/e2e/sample_health.py" --kubeconfig "$kubeconfig" --kubectl "$bin/kubectl" \
      --timeout "$TIMEOUT" "${report[@]}" "$ns" "$name"; then
      log "$ns/$name is not healthy; its conditions:"
      kctl get llmdeployment -n "$ns" "$name" \
        -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2
      exit 1
    fi
  done
  echo
  kctl get llmd -A
  local first_ns first_name svc_ip url router_url body
  read -r _ first_ns first_name <<<"${samples[0]}"
  svc_ip="$(kctl get service -n "$first_ns" "$first_name" -o jsonpath='{.spec.clusterIP}')"
  url="http://$svc_ip:8000/v1/completions"
  body="{\"model\": \"$first_name\", \"prompt\": \"Hello\", \"max_tokens\": 12}"
  if ((real_node)); then
    dev_tenant
    echo
    kctl get pods -n "$first_ns" -l "serving.llmop.dev/deployment=$first_name" -o wide
    router_url="http://$(kctl get service -n "$RELEASE_NAMESPACE" "$RELEASE-router" -o jsonpath='{.spec.clusterIP}'):8080/v1/completions"
    echo
    echo "One completion through the router (the samples' endpoint: one OpenAI API for every LLMDeployment;"
    echo "its gateway wants a tenant's key: LLMTenant dev's is in $work/dev-api-key):"
    echo "\$ curl -sS $router_url -H \"Authorization: Bearer \$OPENAI_API_KEY\" -H 'Content-Type: application/json' -d '$body'"
    local tries=0
    until curl -sSf "$router_url" -H "Authorization: Bearer $dev_key" -H 'Content-Type: application/json' -d "$body"; do
      # The router lists a model once its endpoints are ready in the router's own watch.
      ((++tries < 20)) || { log "the completion through the router failed"; exit 1; }
      sleep 1
    done
    echo
    echo
    echo "And one through the sample's own Service (ClusterIP $svc_ip, routed by kube-proxy):"
    echo "\$ curl -sS $url -H 'Content-Type: application/json' -d '$body'"
    curl -sS "$url" -H 'Content-Type: application/json' -d "$body" || { log "the completion failed"; exit 1; }
    echo
    url="$router_url"
    auth_line="  export OPENAI_API_KEY=\$(cat $work/dev-api-key)   # LLMTenant dev's key: the router's gateway asks for it
  export OPENAI_BASE_URL=${router_url%/completions}"
    auth_header=" -H \"Authorization: Bearer \$OPENAI_API_KEY\""
    # The router's table, metrics and activity are on each pod's admin port, on no Service.
    local router_pod_ip
    router_pod_ip="$(kctl get pods -n "$RELEASE_NAMESPACE" -l app.kubernetes.io/name=llmop-router \
      -o jsonpath='{.items[0].status.podIP}')"
    router_info="Router: table, metrics and activity on a pod's admin port (not on its Service): curl -sS http://$router_pod_ip:8081/routes"
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
${auth_line:-}
  curl -sS $url${auth_header:-} -H 'Content-Type: application/json' \\
    -d '{"model": "$first_name", "prompt": "Hello", "max_tokens": 12}'
$operator_info
${router_info:-}
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

# `stop`: undo `up` but keep the cluster (the e2e test of `make dev` runs `up` on its session's
# cluster, then this): the operator stopped, the samples and the router objects deleted.
cmd_stop() {
  stop_operator
  local kubeconfig work bin samples line file
  kubeconfig="$(cluster_kubeconfig)"
  work="$(dirname "$kubeconfig")"
  bin="$(cat "$work/bin-dir")"
  kctl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
  mapfile -t samples < <(simulator_examples)
  for line in "${samples[@]}"; do
    read -r file _ <<<"$line"
    kctl delete --ignore-not-found --wait=false -f "$file" >/dev/null
  done
  if [[ -z "$(release status "$kubeconfig")" ]]; then
    router_objects | kctl delete --ignore-not-found -f - >/dev/null
  fi
  kctl delete llmtenant dev --ignore-not-found >/dev/null 2>&1 || true
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
stop) cmd_stop ;;
*)
  echo "usage: $0 up|down|stop" >&2
  exit 2
  ;;
esac
