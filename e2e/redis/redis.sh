#!/usr/bin/env bash
# A redis-server for tests and benches (the router gateway's shared store), from Debian's own
# packages, without installing anything on the machine: `apt-get download` of redis-server,
# redis-tools and the libraries redis-tools links that a minimal Debian lacks (libjemalloc2,
# liblzf1, libatomic1, libssl3 on bookworm: its `lib*` Depends but libc6 and libsystemd0, which
# every apt-based system has), each unpacked with `dpkg -x` into a cache directory OUTSIDE the
# clone, beside two wrappers that run the binaries with LD_LIBRARY_PATH on the unpacked libraries.
#
# The directory is keyed on the exact packages (file names and SHA-256 from the signed apt lists):
#   ${LLMOP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/llmop}/redis-<version>-<key>/
#     bin/redis-server bin/redis-cli   wrappers (LD_LIBRARY_PATH, then exec the real binary)
#     root/                            the packages' files (dpkg -x)
#     debs/                            the .deb files (e2e/images builds the redis image from them)
#     packages.txt                     what was downloaded: name, size, SHA256
# It is made in `<dir>.partial`, smoke-checked (every library resolves, --version answers) and
# renamed into place under a lock, so a killed run never leaves a directory that looks finished.
# Reading the key costs two apt calls (~2 s here: the apt cache is not kept); it is remembered
# against the apt lists' and sources' state, so a warm `ensure` answers in milliseconds.
#
# apt-get update runs only when the lists cannot resolve the packages or a download fails (stale
# lists), and only as root; otherwise the script says what to do. The host's dpkg state is never
# touched.
#
# Usage:
#   e2e/redis/redis.sh ensure    download and unpack if needed; print the redis-server wrapper
#
# Environment:
#   LLMOP_CACHE / XDG_CACHE_HOME   cache root (default ~/.cache/llmop)
set -euo pipefail

# Bump when how the directory is made changes (packages chosen, layout, wrappers).
RECIPE=1
LABEL="redis"
CACHE_ROOT="${LLMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
RESOLVED="$CACHE_ROOT/.redis-resolved"

log() { echo "$LABEL: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ "${1:-}" == ensure && $# -eq 1 ]] || { echo "usage: $0 ensure" >&2; exit 2; }
command -v apt-get >/dev/null || die "needs apt-get and dpkg (Debian or Ubuntu); elsewhere point LLMOP_REDIS_SERVER at a redis-server binary"

# What apt's answer depends on: the lists, the sources, the preferences, the architecture, and
# this script. Unchanged, the last resolution still holds and no apt call is needed.
apt_state() {
  {
    echo "recipe=$RECIPE arch=$(dpkg --print-architecture)"
    sha256sum <"${BASH_SOURCE[0]}" # content only: the path it is called by varies
    # -L: sources may be links. Missing globs stay literal and stat says so on stderr: ignored.
    stat -L -c '%n %s %Y' /var/lib/apt/lists/*_Packages* /var/lib/apt/lists/*Release \
      /etc/apt/sources.list /etc/apt/sources.list.d/* /etc/apt/preferences \
      /etc/apt/preferences.d/* 2>/dev/null || true
  } | sha256sum | cut -c1-16
}

state="$(apt_state)"
if [[ -f "$RESOLVED" ]]; then
  read -r was dir <"$RESOLVED" || true
  if [[ "${was:-}" == "$state" && -f "${dir:-}/.complete" ]]; then
    echo "$dir/bin/redis-server"
    exit 0
  fi
fi

# The packages: redis-server, redis-tools, and redis-tools' library dependencies but libc6 (the
# loader must match it: never from a private copy) and libsystemd0 (apt itself needs it).
packages() {
  local deps
  deps="$(apt-cache depends redis-tools 2>/dev/null)" || return 1
  echo redis-server redis-tools
  sed -nE 's/^  Depends: (lib[^ <>]+)$/\1/p' <<<"$deps" | grep -vxE 'libc6|libsystemd0'
}

# `apt-get download --print-uris`: one line per package, 'URI' FILE SIZE SHA256:HEX. Empty or
# failing when the lists do not know the packages (a fresh machine's empty lists).
uris() {
  local pkgs
  pkgs="$(packages)" || return 1
  # From /: apt leaves out packages whose file is already in the working directory.
  # shellcheck disable=SC2086 # one word per package
  (cd / && apt-get download --print-uris $pkgs 2>/dev/null)
}

apt_update() {
  [[ "$(id -u)" == 0 ]] || die "the apt lists cannot provide redis-server ($1); run \`sudo apt-get update\`, or point LLMOP_REDIS_SERVER at a redis-server binary"
  log "apt lists $1: apt-get update"
  local i
  for i in 1 2 3; do # another apt may hold the lists' lock for a while
    apt-get update -q >&2 && return 0
    log "apt-get update failed (attempt $i); retrying in 10 s"
    sleep 10
  done
  die "apt-get update failed"
}

lines="$(uris)" || lines=""
if [[ -z "$lines" ]]; then
  apt_update "do not know the packages"
  lines="$(uris)" || die "apt cannot resolve redis-server and its libraries even after apt-get update"
fi
version="$(awk '$2 ~ /^redis-server_/ { sub(/^redis-server_([0-9]+%3a)?/, "", $2); sub(/_[^_]+\.deb$/, "", $2); print $2 }' <<<"$lines")"
[[ -n "$version" ]] || die "no redis-server in apt's answer: $lines"
key="$({
  echo "recipe=$RECIPE arch=$(dpkg --print-architecture)"
  awk '{ print $2, $3, $4 }' <<<"$lines" | sort
} | sha256sum | cut -c1-12)"
# `~` and `:` (epoch) do not belong in a directory that goes into LD_LIBRARY_PATH.
DIR="$CACHE_ROOT/redis-${version//[^A-Za-z0-9.+-]/_}-$key"

remember() { # the next run with the same apt state skips the apt calls
  printf '%s %s\n' "$(apt_state)" "$DIR" >"$RESOLVED.$$"
  mv "$RESOLVED.$$" "$RESOLVED"
}

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.redis.lock"
flock 9
if [[ -f "$DIR/.complete" ]]; then
  remember
  echo "$DIR/bin/redis-server"
  exit 0
fi

start=$(date +%s.%N)
STAGE="$DIR.partial"
rm -rf "$STAGE"
mkdir -p "$STAGE/debs" "$STAGE/root" "$STAGE/bin"
names="$(awk '{ print $2 }' <<<"$lines" | sed -E 's/_.*//' | tr '\n' ' ')"
log "downloading ${names% } (Debian redis $version) into $DIR"
download() {
  # As root apt would hand the download to its _apt user, which cannot write here; the files
  # are still checked against the SHA-256 of the signed lists.
  # shellcheck disable=SC2086 # one word per package
  (cd "$STAGE/debs" && apt-get download -q -o APT::Sandbox::User="$(id -un)" $names >&2)
}
if ! download; then
  rm -rf "$STAGE"
  [[ -z "${LLMOP_REDIS_UPDATED:-}" ]] || die "apt-get download failed even with fresh lists"
  # A superseded version is gone from the mirror: newer lists name the one that is there.
  apt_update "name a version the mirror no longer has"
  # The directory's name follows the new versions: start again, once.
  flock -u 9
  LLMOP_REDIS_UPDATED=1 exec "${BASH_SOURCE[0]}" ensure
fi
printf '%s\n' "$lines" | awk '{ print $2, $3, $4 }' | sort >"$STAGE/packages.txt"
(cd "$STAGE/debs" && awk '{ sub(/^SHA256:/, "", $3); print $3 "  " $1 }' ../packages.txt |
  sha256sum --quiet -c - >&2) || die "a downloaded package does not match apt's SHA-256"
for deb in "$STAGE"/debs/*.deb; do
  dpkg -x "$deb" "$STAGE/root"
done

# The directories holding the unpacked shared libraries, relative to the wrappers' directory.
libdirs="$(cd "$STAGE/root" && find . -name 'lib*.so*' \( -type f -o -type l \) -printf '%h\n' | sort -u |
  sed -E 's|^\./|$here/../root/|' | paste -sd: -)"
[[ -n "$libdirs" ]] || die "no shared library among the unpacked packages"
for tool in redis-server redis-cli; do
  [[ -e "$STAGE/root/usr/bin/$tool" ]] || die "usr/bin/$tool is not in the packages"
  # redis-server is a link to redis-check-rdb: the binary picks its role from argv[0], which
  # exec through the link keeps.
  cat >"$STAGE/bin/$tool" <<EOF
#!/bin/sh
# Debian's $tool, unpacked by e2e/redis/redis.sh; its libraries from the packages beside it.
here="\$(dirname "\$(readlink -f "\$0")")"
export LD_LIBRARY_PATH="$libdirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "\$here/../root/usr/bin/$tool" "\$@"
EOF
  chmod 0755 "$STAGE/bin/$tool"
  # Every library must resolve: one the packages lack and this machine lacks too is named here,
  # not at the first test. Output captured first (no pipe into grep under pipefail).
  out="$(LD_LIBRARY_PATH="${libdirs//\$here\/..\/root/$STAGE/root}" ldd "$STAGE/root/usr/bin/$tool" 2>&1)" ||
    die "ldd $tool failed: $out"
  [[ "$out" != *"not found"* ]] || die "$tool needs libraries neither the packages nor this machine have: $out"
done
out="$("$STAGE/bin/redis-server" --version 2>&1)" || die "redis-server --version failed: $out"
[[ "$out" == "Redis server v="* ]] || die "redis-server --version says: $out"
log "$out"
echo "$(date -u +%FT%TZ) $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')s" >"$STAGE/.complete"
rm -rf "$DIR"
mv "$STAGE" "$DIR"
remember
log "ready in $DIR ($(cut -d' ' -f2 "$DIR/.complete"))"
echo "$DIR/bin/redis-server"
