# Sourced by build.sh and build-metrics.sh: the one recipe both follow to build Go binaries into a
# cache directory OUTSIDE the clone. A set is built into `<dir>.partial` under one machine-wide
# lock (two Go builds on 2 cores only slow each other), smoke-checked, marked `.complete` and
# renamed into place, so a killed build never leaves a directory that looks finished.
#
# The caller sets LABEL (for messages), CACHE_ROOT, BIN_DIR and HERE, then:
#   go_cache_open "<how long a cold build takes>" <module dir>...
#                         exits printing BIN_DIR when it is complete; else downloads the modules
#                         (before the lock, so a concurrent build's compile overlaps them) and
#                         takes the lock
#   go_cache_build <name> <dir> <tags> <ldflags> <pkg>   into $STAGE, timed into $TIMES
#   go_cache_check_version <binary> <expected substring> [args...]
#   go_cache_close <binary>...                      records sizes, publishes, prints BIN_DIR
# LLMOP_GO_BUILD_P sets `go build -p` (default 2: shared 2-core machines); GO_CACHE_NICE (default
# 0) lowers the builds' priority.

go_cache_complete() { [[ -f "$BIN_DIR/.complete" ]]; }

go_cache_open() { # go_cache_open <cold build estimate> <module dir>...
  local estimate="$1" dir
  shift
  if go_cache_complete; then
    echo "$LABEL: reusing $BIN_DIR" >&2
    echo "$BIN_DIR"
    exit 0
  fi
  for dir in "$@"; do
    echo "$LABEL: downloading the modules of ${dir##*/}/" >&2
    # Best effort: `go build` fetches whatever is still missing (and fails loudly if it can't).
    (cd "$dir" && go mod download) || echo "$LABEL: warning: go mod download failed in $dir" >&2
  done
  mkdir -p "$CACHE_ROOT"
  # One builder at a time: `make test` and a pytest session may both get here.
  exec 9>"$CACHE_ROOT/.build.lock"
  flock 9
  if go_cache_complete; then
    echo "$LABEL: reusing $BIN_DIR (built by a concurrent run)" >&2
    echo "$BIN_DIR"
    exit 0
  fi
  STAGE="$BIN_DIR.partial"
  rm -rf "$STAGE"
  mkdir -p "$STAGE"
  P="${LLMOP_GO_BUILD_P:-2}"
  TIMES="$STAGE/build-times.txt"
  echo "# $(go env GOVERSION), go build -p $P, $(nproc) cores, $(date -u +%FT%TZ)" >"$TIMES"
  echo "$LABEL: building into $BIN_DIR (a cold build takes $estimate)" >&2
  TOTAL_START=$(date +%s)
}

go_cache_build() { # go_cache_build <name> <helper dir> <tags> <ldflags> <package>
  local name="$1" dir="$2" tags="$3" ldflags="$4" pkg="$5" start end
  start=$(date +%s)
  echo "$LABEL: go build $name ($pkg)" >&2
  (cd "$dir" && nice -n "${GO_CACHE_NICE:-0}" \
    go build -p "$P" -trimpath -tags "$tags" -ldflags "$ldflags" -o "$STAGE/$name" "$pkg")
  end=$(date +%s)
  echo "$name $((end - start))s" >>"$TIMES"
  echo "$LABEL: $name done in $((end - start))s" >&2
}

# Output is captured first: `cmd | grep -q` under pipefail fails at random when grep exits before
# the writer (SIGPIPE, exit 141).
go_cache_check_version() { # go_cache_check_version <binary> <expected substring> [args...]
  local bin="$1" want="$2" out
  shift 2
  out="$("$STAGE/$bin" "$@" 2>&1)" || { echo "$LABEL: $bin $* failed: $out" >&2; exit 1; }
  [[ "$out" == *"$want"* ]] || { echo "$LABEL: $bin reports '$out', expected $want" >&2; exit 1; }
}

go_cache_close() { # go_cache_close <binary>...
  echo "total $(($(date +%s) - TOTAL_START))s" >>"$TIMES"
  (cd "$STAGE" && du -sh "$@") >>"$TIMES"
  touch "$STAGE/.complete"
  rm -rf "$BIN_DIR"
  mv "$STAGE" "$BIN_DIR"
  cat "$BIN_DIR/build-times.txt" >&2
  echo "$BIN_DIR"
}
