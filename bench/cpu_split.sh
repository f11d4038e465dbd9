#!/usr/bin/env bash
# Where a proxied request's time goes on the server core: for each server, CPU time per
# request in its own code (user), in the kernel on its behalf (system), in the upstream
# (user + system), in interrupts (the loopback's deliveries), and the core's idle time, read
# from /proc while `wrk` loads it. Instructions per request (bench/callgrind.sh) count only
# user space; this says how much of the wall clock that is.
#
#   bench/cpu_split.sh                                    # gateway on/off, nginx, the apps
#   MODES="on nginx-limit" DURATION=10 ROUNDS=1 bench/cpu_split.sh
#
# The modes are bench/callgrind.sh's (`on`, `off`, `nginx-limit`, `nginx-proxy`, `mw-fleet`,
# `mw-governor`, `mw-bare`). As in bench/run.sh, the server and the upstream share SERVER_CPU
# and `wrk` (CONNS connections, bench/heartbeat.lua) runs on LOAD_CPU. Each mode is warmed up
# for WARMUP seconds, then measured for DURATION seconds; the times are the differences of
# /proc/PID/stat (utime, stime) and of the core's line in /proc/stat over the measurement.
# ROUNDS rounds measure every mode once each, in turn; a line per mode and round.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH="$ROOT/bench"
# shellcheck source=bench/common.sh
. "$BENCH/common.sh"
MODES=${MODES:-"on off nginx-limit nginx-proxy mw-fleet mw-governor mw-bare"}
WARMUP=${WARMUP:-2}
DURATION=${DURATION:-5}
CONNS=${CONNS:-32}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
P_UPSTREAM=${P_UPSTREAM:-18281}
P_SERVER=${P_SERVER:-18280}
ROUNDS=${ROUNDS:-3}

log() { printf '%s\n' "$*" >&2; }

for tool in wrk nginx curl taskset python3; do
  command -v "$tool" >/dev/null || {
    log "missing $tool: apt-get install -y wrk nginx-light curl util-linux python3"
    exit 1
  }
done
for p in "$P_UPSTREAM" "$P_SERVER"; do
  port_free "$p" || { log "port $p is already in use; stop what listens there first"; exit 1; }
done

if [ -z "${GATEWAY:-}" ]; then
  (cd "$ROOT" && cargo build --profile profiling --quiet --bin fleet-limiter)
  GATEWAY="$ROOT/target/profiling/fleet-limiter"
fi
if [ -z "${MW:-}" ]; then
  (cd "$BENCH/middleware" && CARGO_TARGET_DIR="$ROOT/target" cargo build --profile profiling --quiet --bins)
  MW="$ROOT/target/profiling/fleet-limiter-bench-middleware"
fi

TMP=$(mktemp -d /tmp/fleet-limiter-cpu-split.XXXXXX)
PIDS=()
trap stop_all EXIT
allowed_limits "$TMP/limits.toml"

upstream_nginx_conf "$TMP/nginx-up" "$P_UPSTREAM"
start upstream nginx -c "$TMP/nginx-up/nginx.conf"
wait_up "http://127.0.0.1:$P_UPSTREAM/" >/dev/null
# The upstream's master and its worker (which does the work).
upstream=("${PIDS[0]}" $(pgrep -P "${PIDS[0]}"))

# ticks PID...: utime and stime of the processes, summed, in clock ticks.
ticks() {
  local p
  for p in "$@"; do
    # Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12, $13}'
  done | awk '{u += $1; s += $2} END {print u + 0, s + 0}'
}

# core: user+nice, system, irq+softirq, idle (+iowait) of SERVER_CPU, in clock ticks.
core() {
  awk -v c="cpu$SERVER_CPU" '$1 == c {print $2 + $3, $4, $7 + $8, $5 + $6}' /proc/stat
}

printf '%-12s %9s %8s %8s %9s %8s %7s %9s\n' mode "req/s" "user µs" "sys µs" "upstr µs" "irq µs" "idle %" "total µs"
for mode in $(for _ in $(seq "$ROUNDS"); do echo $MODES; done); do
  server_command "$mode"
  taskset -c "$SERVER_CPU" env "${ENVS[@]}" "${CMD[@]}" >"$TMP/server-$mode.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_up "http://127.0.0.1:$P_SERVER/api/agent/heartbeat" >/dev/null ||
    { log "$mode did not start: $(tail -5 "$TMP/server-$mode.log")"; exit 1; }
  taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${WARMUP}s" -s "$BENCH/heartbeat.lua" \
    "http://127.0.0.1:$P_SERVER/api/agent/heartbeat" >/dev/null
  # The server's threads are its own process's: /proc/PID/stat sums them.
  read -r su0 ss0 <<<"$(ticks "$pid")"
  read -r uu0 us0 <<<"$(ticks "${upstream[@]}")"
  read -r cu0 cs0 ci0 cd0 <<<"$(core)"
  requests=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$BENCH/heartbeat.lua" \
    "http://127.0.0.1:$P_SERVER/api/agent/heartbeat" | awk '/requests in/ {print $1}')
  read -r su1 ss1 <<<"$(ticks "$pid")"
  read -r uu1 us1 <<<"$(ticks "${upstream[@]}")"
  read -r cu1 cs1 ci1 cd1 <<<"$(core)"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  python3 - "$mode" "$requests" "$DURATION" "$(getconf CLK_TCK)" \
    $((su1 - su0)) $((ss1 - ss0)) $((uu1 + us1 - uu0 - us0)) \
    $((ci1 - ci0)) $((cd1 - cd0)) $((cu1 + cs1 + ci1 + cd1 - cu0 - cs0 - ci0 - cd0)) <<'EOF'
import sys
mode, n, secs, hz = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
user, sys_, up, irq, idle, total = (int(x) for x in sys.argv[5:11])
us = lambda t: t * 1e6 / hz / max(n, 1)
print(f"{mode:<12} {n / secs:9.0f} {us(user):8.2f} {us(sys_):8.2f} {us(up):9.2f} {us(irq):8.2f} "
      f"{100 * idle / max(total, 1):7.1f} {us(total - idle):9.2f}")
EOF
done
