#!/usr/bin/env bash
# Instructions per request, counted by callgrind in the server process under load: a measure
# that does not move with other tenants' load, unlike requests per second.
#
#   bench/callgrind.sh                      # the gateway, limiter on and off
#   MODES="mw-fleet mw-governor mw-bare" bench/callgrind.sh   # the three middleware apps
#   GATEWAY=path/to/other/fleet-limiter bench/callgrind.sh    # the gateway of another build
#   MODES=on TOP=60 bench/callgrind.sh      # one mode, a longer list of functions
#   MODES=decision bench/callgrind.sh       # the forward-auth decision endpoint alone
#   MODES="on shaped" bench/callgrind.sh    # what [shaping] adds (slots, upstream watch)
#   MODES="hdr-off hdr-draft-7 hdr-draft-6-legacy" bench/callgrind.sh   # header profiles
#   MODES="nginx-limit nginx-proxy on off" bench/callgrind.sh   # nginx as the reference
#
# Modes: `on` and `off` are the gateway (rows 2 and 3 of bench/run.sh) in front of nginx
# `return 200`; `mw-fleet`, `mw-governor` and `mw-bare` are the actix-web apps of rows 6a-6c
# (bench/middleware); `decision` is the decision endpoint with no upstream, asked by
# bench/decision.lua as a proxy asks it. Budgets are so large that every request is allowed.
# `hdr-STANDARD[-legacy[-delta]]` is `on` with that `[headers]` profile (`hdr-off`: no limit
# header at all; `hdr-draft-6-legacy`: the default; `-delta`: legacy reset in seconds).
# `nginx-limit` is bench/run.sh's row 5 (nginx `limit_req` reverse proxy, keep-alive to the
# same upstream) and `nginx-proxy` the same nginx without `limit_req`, one worker process run
# in the foreground with `master_process off` so that callgrind counts the process that serves.
#
# For each mode the server starts under `valgrind --tool=callgrind`; `wrk -c4` with
# bench/heartbeat.lua warms it up for WARMUP seconds, the counters are zeroed
# (`callgrind_control -z`), `wrk` runs MEASURE seconds, the counters are dumped
# (`callgrind_control -d`). Instructions per request = the dump's total over the requests wrk
# completed. Then, in $OUT: each mode's functions by their own (self) instructions per request
# (self.MODE.txt), and function by function what the limiter adds (printed too):
# on-minus-off.txt for the gateway, mw-fleet-minus-mw-bare.txt and
# mw-governor-minus-mw-bare.txt for the middleware, when both modes of a pair ran.
#
# valgrind has no SHA-NI: SHA-256 runs its portable rounds here (~3 500 instructions per
# digest), which the real CPU does in a few hundred cycles; and it counts each byte of a
# `rep stosb` (large `memset`s) as an instruction: the table's last column is what `memset`
# took of each request (actix-http zeroes a ~3 KiB header table each time its request decoder
# runs, twice per pass of its dispatcher, ~3 100 counted instructions each). Compare counts
# between builds and modes, not with wall-clock time.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH="$ROOT/bench"
# shellcheck source=bench/common.sh
. "$BENCH/common.sh"
MODES=${MODES:-"on off"}
WARMUP=${WARMUP:-3}
MEASURE=${MEASURE:-10}
TOP=${TOP:-30}
P_UPSTREAM=${P_UPSTREAM:-18181}
P_SERVER=${P_SERVER:-18180}
OUT=${OUT:-"$ROOT/target/bench-results/callgrind"}

log() { printf '%s\n' "$*" >&2; }

for tool in valgrind callgrind_control wrk nginx curl python3; do
  command -v "$tool" >/dev/null || {
    log "missing $tool: apt-get install -y valgrind wrk nginx-light curl python3"
    exit 1
  }
done

gateway_modes=false middleware_modes=false
for mode in $MODES; do
  case $mode in
    on | off | shaped | decision | hdr-* | nginx-limit | nginx-proxy) gateway_modes=true ;;
    mw-fleet | mw-governor | mw-bare) middleware_modes=true ;;
    *) log "unknown mode $mode (on, off, shaped, decision, hdr-STANDARD[-legacy[-delta]], nginx-limit, nginx-proxy, mw-fleet, mw-governor, mw-bare)"; exit 2 ;;
  esac
done

if $gateway_modes && [ -z "${GATEWAY:-}" ] && [[ " $MODES " =~ \ (on|off|shaped|decision|hdr-[^ ]*)\  ]]; then
  log "building the gateway"
  (cd "$ROOT" && cargo build --profile profiling --quiet --bin fleet-limiter)
  GATEWAY="$ROOT/target/profiling/fleet-limiter"
fi
if $middleware_modes && [ -z "${MW:-}" ]; then
  log "building the middleware apps"
  (cd "$BENCH/middleware" && CARGO_TARGET_DIR="$ROOT/target" cargo build --profile profiling --quiet --bins)
  MW="$ROOT/target/profiling/fleet-limiter-bench-middleware"
fi

for p in "$P_UPSTREAM" "$P_SERVER"; do
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

allowed_limits "$TMP/limits.toml"

wait_up() {
  local i
  for i in $(seq 300); do
    curl -s -o /dev/null -X POST "http://127.0.0.1:$1/api/agent/heartbeat" && return 0
    sleep 0.1
  done
  return 1
}

if $gateway_modes; then
  upstream_nginx_conf "$TMP/nginx-up" "$P_UPSTREAM"
  nginx -c "$TMP/nginx-up/nginx.conf" >"$TMP/nginx.log" 2>&1 &
  PIDS+=($!)
  wait_up "$P_UPSTREAM" || { log "the upstream did not start: $(cat "$TMP/nginx.log")"; exit 1; }
fi

printf '%-12s %10s %12s %16s %14s\n' mode requests "Ir total" "Ir per request" "of it memset"
for mode in $MODES; do
  out="$OUT/callgrind.$mode.out"
  rm -f "$out" "$out".*
  server_command "$mode"
  env "${ENVS[@]}" valgrind --tool=callgrind --callgrind-out-file="$out" "${CMD[@]}" \
    >"$TMP/server-$mode.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_up "$P_SERVER" || { log "$mode did not start: $(tail -5 "$TMP/server-$mode.log")"; exit 1; }
  script="$BENCH/heartbeat.lua"
  [ "$mode" = decision ] && script="$BENCH/decision.lua"
  wrk -t1 -c4 -d"${WARMUP}s" -s "$script" "http://127.0.0.1:$P_SERVER" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  requests=$(wrk -t1 -c4 -d"${MEASURE}s" -s "$script" "http://127.0.0.1:$P_SERVER" |
    awk '/requests in/ {print $1}')
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # The dump taken on request is the file with the highest sequence number.
  dump=$(ls -1v "$out".* | tail -1)
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
  cp "$dump" "$out"
  echo "$requests" >"$out.requests"
  python3 "$BENCH/callgrind_self.py" "$out" "$requests" "$TOP" >"$OUT/self.$mode.txt"
  zeroing=$(awk '/ of which memset$/ {print $1; exit}' "$OUT/self.$mode.txt")
  printf '%-12s %10s %12s %16s %14s\n' "$mode" "$requests" "$total" "$((total / requests))" "$zeroing"
done

# What a limiter adds, function by function: self cost per request, with it minus without.
for pair in "on off" "mw-fleet mw-bare" "mw-governor mw-bare" "nginx-limit nginx-proxy"; do
  read -r a b <<<"$pair"
  [[ " $MODES " == *" $a "* && " $MODES " == *" $b "* ]] || continue
  python3 "$BENCH/callgrind_self.py" "$OUT/callgrind.$a.out" "$(cat "$OUT/callgrind.$a.out.requests")" \
    "$OUT/callgrind.$b.out" "$(cat "$OUT/callgrind.$b.out.requests")" "$TOP" >"$OUT/$a-minus-$b.txt"
  printf '\n%s minus %s\n' "$a" "$b"
  cat "$OUT/$a-minus-$b.txt"
done
