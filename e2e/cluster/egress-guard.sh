#!/usr/bin/env bash
# Keeps every address range the local cluster hands out (ranges.sh) on this machine, and proves it.
#
# While any holder (a cluster, a test session) is registered:
#   - routes: each range has an `unreachable` route of metric 4242, so a connection to an address
#     nothing local serves fails at once with EHOSTUNREACH instead of taking the default route.
#     Anything that does serve a range wins with a lower metric: the real node's bridge (its
#     connected pod route, and node.sh's Service CIDR routes, which make kube-proxy's ClusterIPs
#     work from the host);
#   - a guard: chain LLMOP-EGRESS-GUARD in iptables' filter table, jumped to from OUTPUT and
#     FORWARD for packets leaving through the default route's interface, drops any packet to those
#     ranges, counts it per range and records its destination (xt_recent list llmop_egress). Only
#     those ranges: DNS and the package registries go out through the same interface untouched.
# The last holder's `down` removes exactly the routes and rules `up` added.
#
# Usage:
#   egress-guard.sh up <holder> <liveness>   register a holder and install what is missing;
#                                            <liveness>: a pid or a directory that exists while
#                                            the holder lives (stale holders are pruned)
#   egress-guard.sh down <holder>            unregister; the last one out removes everything
#   egress-guard.sh counts                   "range <cidr> <packets>" and "dest <ip> <hits>" lines
#                                            (nothing when the guard is not installed)
#   egress-guard.sh ranges                   "<what> <cidr>" lines: service, kwok-pods, real-node-pods, real-node-ip
#   egress-guard.sh status                   holders, routes and counters
#
# Needs root and iptables (installed from Debian's packages when missing). Without them it says
# why and exits 0: the cluster still starts, unguarded.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=ranges.sh
source "$HERE/ranges.sh"

CHAIN=LLMOP-EGRESS-GUARD
RECENT=llmop_egress
METRIC=4242
STATE=/run/llmop-egress-guard
HOLDERS="$STATE/holders"
LOCK=/run/llmop-egress-guard.lock

log() { echo "egress-guard: $*" >&2; }

why_not() {
  [[ "$(uname -s)" == Linux ]] || { echo "not Linux"; return; }
  [[ "$(id -u)" == 0 ]] || { echo "not root (routes and iptables rules need root)"; return; }
  command -v ip >/dev/null || { echo "no 'ip' command (iproute2)"; return; }
  echo ""
}

ensure_iptables() {
  command -v iptables >/dev/null && return 0
  command -v apt-get >/dev/null || { log "iptables is missing and there is no apt-get"; return 1; }
  log "installing Debian's iptables package"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables >/dev/null 2>&1 || {
    DEBIAN_FRONTEND=noninteractive apt-get update >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables >/dev/null 2>&1
  }
}

# The interface of the default route now (the one a leaked packet would take), e.g. eth0.
default_interface() {
  local out
  out="$(ip -4 route show default)"
  awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }' <<<"$out"
}

holder_alive() { # holder_alive <file>
  local liveness
  liveness="$(cat "$1" 2>/dev/null || true)"
  if [[ "$liveness" =~ ^[0-9]+$ ]]; then
    kill -0 "$liveness" 2>/dev/null
  else
    [[ -n "$liveness" && -d "$liveness" ]]
  fi
}

prune_holders() {
  local f
  for f in "$HOLDERS"/*; do
    [[ -e "$f" ]] || continue
    holder_alive "$f" || { log "dropping stale holder $(basename "$f")"; rm -f "$f"; }
  done
}

holder_count() { compgen -G "$HOLDERS/*" | wc -l; }

# The guard's rule for one range (with xt_recent when the kernel has it, so the destinations are
# named; the packet count alone otherwise).
rule_args() { # rule_args <cidr>
  if [[ -f "$STATE/recent" ]]; then
    echo "-d $1 -m recent --name $RECENT --rdest --set -j DROP"
  else
    echo "-d $1 -j DROP"
  fi
}

install() {
  local r iface
  for r in "${LOCAL_RANGES[@]}"; do
    ip route replace unreachable "$r" metric "$METRIC"
  done
  iface="$(cat "$STATE/interface" 2>/dev/null || default_interface)"
  if [[ -z "$iface" ]]; then
    log "no default route: nothing can leave this machine by it; routes only"
    return 0
  fi
  echo "$iface" >"$STATE/interface"
  if ! iptables -w -n -L "$CHAIN" >/dev/null 2>&1; then
    iptables -w -N "$CHAIN"
    # Probe xt_recent once, on the new (empty) chain.
    if iptables -w -A "$CHAIN" -d 127.0.0.2/32 -m recent --name "$RECENT" --rdest --set -j RETURN 2>/dev/null; then
      iptables -w -F "$CHAIN"
      touch "$STATE/recent"
    else
      rm -f "$STATE/recent"
    fi
  fi
  local args c
  for r in "${LOCAL_RANGES[@]}"; do
    read -r -a args <<<"$(rule_args "$r")"
    iptables -w -C "$CHAIN" "${args[@]}" 2>/dev/null || iptables -w -A "$CHAIN" "${args[@]}"
  done
  for c in OUTPUT FORWARD; do
    iptables -w -C "$c" -o "$iface" -j "$CHAIN" 2>/dev/null || iptables -w -I "$c" 1 -o "$iface" -j "$CHAIN"
  done
}

uninstall() {
  local r iface c
  for r in "${LOCAL_RANGES[@]}"; do
    ip route del unreachable "$r" metric "$METRIC" 2>/dev/null || true
  done
  iface="$(cat "$STATE/interface" 2>/dev/null || true)"
  if [[ -n "$iface" ]] && command -v iptables >/dev/null; then
    for c in OUTPUT FORWARD; do
      while iptables -w -D "$c" -o "$iface" -j "$CHAIN" 2>/dev/null; do :; done
    done
    iptables -w -F "$CHAIN" 2>/dev/null || true
    iptables -w -X "$CHAIN" 2>/dev/null || true
  fi
  rm -f "$STATE/interface" "$STATE/recent"
}

locked() { # locked <command...>: run with the guard's lock held
  mkdir -p "$HOLDERS"
  exec 9>"$LOCK"
  flock 9
  "$@"
}

up_locked() {
  local holder="$1" liveness="$2"
  prune_holders
  echo "$liveness" >"$HOLDERS/$holder"
  install
  log "installed for $holder ($(holder_count) holder(s); ranges ${LOCAL_RANGES[*]})"
}

down_locked() {
  rm -f "$HOLDERS/$1"
  prune_holders
  if (($(holder_count) == 0)); then
    uninstall
    log "removed (no holder left)"
  fi
}

cmd_counts() {
  command -v iptables >/dev/null || return 0
  local out
  out="$(iptables -w -n -v -x -L "$CHAIN" 2>/dev/null)" || return 0
  # Rows: pkts bytes target prot opt in out source destination ...
  awk 'NR > 2 && $3 == "DROP" { print "range", $9, $1 }' <<<"$out"
  if [[ -r "/proc/net/xt_recent/$RECENT" ]]; then
    out="$(cat "/proc/net/xt_recent/$RECENT")"
    # "src=10.250.0.3 ttl: 64 last_seen: T oldest_pkt: I T1, T2, T3": with --rdest, src= is the
    # destination, and the hits are the time stamps after the oldest's index (the list keeps
    # up to 20 per address).
    awk 'NF { split($1, a, "="); n = 0
      for (i = 1; i < NF; i++) if ($i == "oldest_pkt:") n = NF - i - 1
      print "dest", a[2], n }' <<<"$out"
  fi
}

cmd_status() {
  local f
  echo "holders:"
  for f in "$HOLDERS"/*; do
    [[ -e "$f" ]] && echo "  $(basename "$f") ($(cat "$f"))"
  done
  echo "routes:"
  ip route show metric "$METRIC" 2>/dev/null | sed 's/^/  /' || true
  echo "counters:"
  cmd_counts | sed 's/^/  /'
}

case "${1:-}" in
up | down)
  if [[ "$1" == up && $# -ne 3 ]] || [[ "$1" == down && $# -ne 2 ]]; then
    echo "usage: $0 up <holder> <pid-or-dir> | down <holder>" >&2
    exit 2
  fi
  reason="$(why_not)"
  if [[ -n "$reason" ]]; then
    log "NOT installed: $reason; the cluster's ranges may take the default route"
    exit 0
  fi
  if [[ "$1" == up ]]; then
    ensure_iptables || { log "NOT installed: no iptables"; exit 0; }
    locked up_locked "$2" "$3"
  else
    locked down_locked "$2"
  fi
  ;;
counts) cmd_counts ;;
ranges)
  printf 'service %s\n' "$SERVICE_CIDR" "${EXTRA_SERVICE_CIDRS[@]}"
  echo "kwok-pods $KWOK_POD_CIDR"
  echo "real-node-pods $REAL_NODE_POD_CIDR"
  echo "real-node-ip $REAL_NODE_IP/32"
  ;;
status) cmd_status ;;
*)
  echo "usage: $0 up <holder> <pid-or-dir> | down <holder> | counts | ranges | status" >&2
  exit 2
  ;;
esac
