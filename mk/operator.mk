# The operator (`llmop run`) against the local cluster, and its throughput benchmark.

##@ Operator

N ?= 100,500,1000
AGENTS ?= 100

.PHONY: run
run: install ## Run the operator against the local cluster (make cluster-up first).
	KUBECONFIG=$(shell $(MAKE) -s --no-print-directory cluster-kubeconfig) $(BIN)/llmop run

# Its own control plane with kwok nodes only: no real node, no Prometheus scraping, nothing
# else on the API server the operator is measured against. Removed afterwards.
BENCH_CLUSTER := LLMOP_CLUSTER_NAME=llmop-bench-operator LLMOP_REAL_NODE=off LLMOP_METRICS=off $(CLUSTER_SH)

.PHONY: bench-operator
bench-operator: install ## Operator benchmark: N CRs at once (N=100,500,1000): time to children + status, RSS (FLOOR=1: the cluster alone, no operator; FLOOR=kopf: and kopf with no-op handlers).
	KUBECONFIG=$$($(BENCH_CLUSTER) up | tail -n 1) $(PY) bench/operator_bench.py --counts $(N); \
	  status=$$?; $(BENCH_CLUSTER) down; exit $$status

bench: bench-operator

# KubeAI v0.22.1 built from Go modules (e2e/cluster/build-kubeai.sh, cached in ~/.cache/llmop; where
# the module proxy refuses the module, KUBEAI_SRC=<a checkout of its v0.22.1 tag>), run after llmop
# on the same bench cluster. N defaults to 100,1000 here; stock KubeAI runs only at N <= 100.
.PHONY: bench-vs-kubeai
bench-vs-kubeai: install ## llmop beside KubeAI (as shipped, and patched to 16 workers) at N=100,1000: pods created/Ready, CRs Ready, CPU, RSS.
	KUBEAI_DIR=$$(e2e/cluster/build-kubeai.sh) || exit $$?; \
	KUBECONFIG=$$($(BENCH_CLUSTER) up | tail -n 1) $(PY) bench/vs_kubeai_bench.py --kubeai "$$KUBEAI_DIR" \
	  $(if $(filter-out file,$(origin N)),--counts $(N)); \
	  status=$$?; $(BENCH_CLUSTER) down; exit $$status

.PHONY: bench-rollout
bench-rollout: install cluster-binaries ## Requests lost during a rollout of 3 replicas under load: llmop vs rivals' pod specs (real node; NO_VLLM=1, KEEPALIVE=1, ONLY=llmop,..., NODE_GPUS=4, TIMELINE=1).
	$(if $(NODE_GPUS),LLMOP_NODE_GPUS=$(NODE_GPUS)) $(PY) bench/rollout_bench.py $(if $(NO_VLLM),--no-vllm) $(if $(KEEPALIVE),--keepalive) $(if $(ONLY),--only $(ONLY)) $(if $(TIMELINE),--timeline)

bench: bench-rollout

# WAKE_ENGINE=vllm-cpu wakes vLLM's CPU build instead of the simulator: it builds (or reuses) the
# ~6 GB engine-cpu image (~25 min cold) and needs vLLM's CPU venv for the tiny model.
WAKE_ENGINE ?= simulator

.PHONY: bench-wake
bench-wake: install cluster-binaries $(if $(filter vllm-cpu,$(WAKE_ENGINE)),vllm-cpu) ## Scale to zero: where a wake's seconds go, request held → first token (real node; WAKE_ENGINE=vllm-cpu for the real engine, COMPILE_CACHE=both its compile cache off and on side by side).
	$(PY) bench/wake_bench.py --engine $(WAKE_ENGINE) $(if $(COMPILE_CACHE),--compile-cache $(COMPILE_CACHE)) $(if $(filter simulator,$(WAKE_ENGINE)),--wakes $(or $(WAKES),5) --cpu $(or $(WAKE_CPU),250m 1))

bench: bench-wake

# COLDSTART_ENGINE=vllm-cpu: vLLM's CPU build with its compile cache off and on (the image rows
# need the simulator: pushing the 6 GB engine-cpu image to a registry and back is not a start).
COLDSTART_ENGINE ?= simulator

.PHONY: bench-coldstart
bench-coldstart: install cluster-binaries $(if $(filter vllm-cpu,$(COLDSTART_ENGINE)),vllm-cpu) ## Where a cold start's seconds go, per step and per engine phase, side by side (real node): simulator: image on the node, pulled from a loopback registry at the start, pre-pulled (spec.scheduling.prePullImage); COLDSTART_ENGINE=vllm-cpu: compile cache off and on.
	$(PY) bench/wake_bench.py --wakes $(or $(WAKES),2) $(if $(filter vllm-cpu,$(COLDSTART_ENGINE)),--engine vllm-cpu --compile-cache both,--image-pull both)

bench: bench-coldstart

.PHONY: bench-fleet
bench-fleet: install ## Cost of reading N engine agents' /status (stand-ins): round time, reads/s, CPU, RSS.
	$(PY) bench/fleet_bench.py --agents $(AGENTS)

bench: bench-fleet
