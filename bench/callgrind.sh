#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind in the gateway process under load:
# a measure that does not move with other tenants' load, unlike requests per second.
#
#   bench/callgrind.sh                       # limiter on and off, the release binary
#   GATEWAY=path/to/other/fleet-limiter bench/callgrind.sh   # the same for another build
#   MODES=on TOP=60 bench/callgrind.sh       # one mode, a longer list of functions
#
# For each mode: the upstream (nginx `return 200`) and the gateway under
# `valgrind --tool=callgrind` start; `wrk -c4` warms up for WARMUP seconds, the counters are
# zeroed (`callgrind_control -z`), `wrk` runs MEASURE seconds, the counters are dumped
# (`callgrind_control -d`). Instructions per request = the dump's total over the requests wrk
# completed. Then, in $OUT: each mode's functions by their own (self) instructions per request
# (self.on.txt, self.off.txt), and, with both modes, what the limiter adds function by function
# (on-minus-off.txt, also printed).
#
# valgrind has no SHA-NI: SHA-256 runs its portable rounds here (~3 500 instructions per
# digest), which the real CPU does in a few hundred cycles. Compare counts between builds and
# modes, not with wall-clock time.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH="$ROOT/bench"
MODES=${MODES:-"on off"}
WARMUP=${WARMUP:-3}
MEASURE=${MEASURE:-10}
TOP=${TOP:-30}
P_UPSTREAM=${P_UPSTREAM:-18181}
P_GATEWAY=${P_GATEWAY:-18180}
OUT=${OUT:-"$ROOT/target/bench-results/callgrind"}

log() { printf '%s\n' "$*" >&2; }

for tool in valgrind callgrind_control callgrind_annotate wrk nginx curl; do
  command -v "$tool" >/dev/null || {
    log "missing $tool: apt-get install -y valgrind wrk nginx-light curl"
    exit 1
  }
done

if [ -z "${GATEWAY:-}" ]; then
  log "building the release binary"
  (cd "$ROOT" && cargo build --release --quiet --bin fleet-limiter)
  GATEWAY="$ROOT/target/release/fleet-limiter"
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "$P_UPSTREAM" "$P_GATEWAY"; do
  port_free "$p" || { log "port $p is already in use; stop what listens there first"; exit 1; }
done

TMP=$(mktemp -d /tmp/fleet-limiter-callgrind.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
mkdir -p "$OUT"

cat >"$TMP/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $TMP/nginx.pid;
error_log stderr error;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $TMP;
  keepalive_requests 100000000;
  server { listen 127.0.0.1:$P_UPSTREAM; location / { return 200 "ok"; } }
}
EOF
nginx -c "$TMP/nginx.conf" >"$TMP/nginx.log" 2>&1 &
PIDS+=($!)

# Budgets nothing exhausts: every measured request takes the allowed path.
cat >"$TMP/limits.toml" <<EOF
[limiters.agent-device]
limit = 1000000000
window = "1m"

[limiters.agent-ip]
limit = 1000000000
window = "1m"
EOF

wait_up() {
  local i
  for i in $(seq 300); do
    curl -s -o /dev/null -X POST "http://127.0.0.1:$1/api/agent/heartbeat" && return 0
    sleep 0.1
  done
  return 1
}
wait_up "$P_UPSTREAM" || { log "the upstream did not start: $(cat "$TMP/nginx.log")"; exit 1; }

printf '%-8s %12s %10s %16s\n' mode requests "Ir total" "Ir per request"
for mode in $MODES; do
  enabled=true
  [ "$mode" = off ] && enabled=false
  out="$OUT/callgrind.$mode.out"
  rm -f "$out"*
  env FLEET_LIMITER_LOG=warn FLEET_LIMITER_ENABLED=$enabled \
    valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$GATEWAY" serve --config "$TMP/limits.toml" --listen "127.0.0.1:$P_GATEWAY" \
    --upstream "http://127.0.0.1:$P_UPSTREAM" --store memory \
    --admin-listen 127.0.0.1:0 --allow-unsafe-calibration >"$TMP/gateway-$mode.log" 2>&1 &
  gw=$!
  PIDS+=("$gw")
  wait_up "$P_GATEWAY" || { log "the gateway did not start: $(tail -5 "$TMP/gateway-$mode.log")"; exit 1; }
  wrk -t1 -c4 -d"${WARMUP}s" -s "$BENCH/heartbeat.lua" "http://127.0.0.1:$P_GATEWAY" >/dev/null
  callgrind_control -z "$gw" >/dev/null 2>&1
  requests=$(wrk -t1 -c4 -d"${MEASURE}s" -s "$BENCH/heartbeat.lua" "http://127.0.0.1:$P_GATEWAY" |
    awk '/requests in/ {print $1}')
  callgrind_control -d "$gw" >/dev/null 2>&1
  kill "$gw" 2>/dev/null || true
  wait "$gw" 2>/dev/null || true
  # The dump taken on request is the file with the highest sequence number.
  dump=$(ls -1v "$out".* | tail -1)
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
  printf '%-8s %12s %10s %16s\n' "$mode" "$requests" "$total" "$((total / requests))"
  cp "$dump" "$out"
  echo "$requests" >"$out.requests"
  python3 "$BENCH/callgrind_self.py" "$out" "$requests" "$TOP" >"$OUT/self.$mode.txt"
done

# What the limiter adds: per-function self cost, limiter on minus limiter off.
if [[ " $MODES " == *" on "* && " $MODES " == *" off "* ]]; then
  python3 "$BENCH/callgrind_self.py" "$OUT/callgrind.on.out" "$(cat "$OUT/callgrind.on.out.requests")" \
    "$OUT/callgrind.off.out" "$(cat "$OUT/callgrind.off.out.requests")" "$TOP" >"$OUT/on-minus-off.txt"
  echo
  cat "$OUT/on-minus-off.txt"
fi
