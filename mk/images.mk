# Container images. They need a container engine (docker or podman), which CI machines without
# one lack: these targets then fail with a clear message; nothing else depends on them.
# Tags default to the version in pyproject.toml, the same tags the chart and the operator use
# by default (ghcr.io/llmop/{operator,engine,engine-sim}:<version>).

CONTAINER_TOOL ?= docker
IMAGE_REGISTRY ?= ghcr.io/llmop
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
OPERATOR_IMG ?= $(IMAGE_REGISTRY)/operator:$(IMAGE_TAG)
ENGINE_IMG ?= $(IMAGE_REGISTRY)/engine:$(IMAGE_TAG)
SIMULATOR_IMG ?= $(IMAGE_REGISTRY)/engine-sim:$(IMAGE_TAG)

define need-container-tool
	@command -v $(CONTAINER_TOOL) >/dev/null 2>&1 || { \
	  echo "$(CONTAINER_TOOL) not found: building images needs a container engine (set CONTAINER_TOOL=podman?)" >&2; \
	  exit 1; }
endef

##@ Images

.PHONY: images
images: image-operator image-engine image-simulator ## Build the operator, engine and simulator images.

.PHONY: image-operator
image-operator: ## Build the operator image (operator/Dockerfile); tag: OPERATOR_IMG=ghcr.io/llmop/operator:<version>.
	$(need-container-tool)
	$(CONTAINER_TOOL) build -f operator/Dockerfile -t $(OPERATOR_IMG) .

.PHONY: image-engine
image-engine: ## Build the vLLM engine image (engine-image/Dockerfile); tag: ENGINE_IMG=ghcr.io/llmop/engine:<version>.
	$(need-container-tool)
	$(CONTAINER_TOOL) build -f engine-image/Dockerfile -t $(ENGINE_IMG) .

.PHONY: image-simulator
image-simulator: ## Build the simulator engine image (engine-image/Dockerfile.sim); tag: SIMULATOR_IMG=ghcr.io/llmop/engine-sim:<version>.
	$(need-container-tool)
	$(CONTAINER_TOOL) build -f engine-image/Dockerfile.sim -t $(SIMULATOR_IMG) .
