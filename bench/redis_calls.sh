#!/usr/bin/env bash
# What the Redis store's shared calls and its local over-limit cache buy, counted on Redis's
# side: for each `store.calls_in_flight` in DEPTHS, the gateway on the Redis store (a private
# redis-server pinned to LOAD_CPU, beside wrk, as in bench/run.sh's row 4b) is loaded on the
# allowed path (budgets nothing exhausts) and on the refusal path (one request per agent per
# hour: after the warm-up every request is refused). Per request: requests per second, script
# calls Redis ran, keys Redis looked up (`keyspace_hits + keyspace_misses`: a request decided by
# Redis reads its buckets, one answered by the over-limit cache reads none) and Redis's own CPU
# time (`INFO commandstats`, the sum of `usec` over every command). `refused-1key` is the
# refusal path with `store.max_keys = 1`, which leaves the over-limit cache one entry (so,
# for 1 000 rotating agents, practically none; the agent-ip ceiling's table of known agents,
# also sized by `store.max_keys`, shrinks with it).
#
#   DEPTHS="1 4 16" DURATION=3s bench/redis_calls.sh      # BUILD=0 reuses the profiling build
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH="$ROOT/bench"
# shellcheck source=bench/common.sh
. "$BENCH/common.sh"
DEPTHS=${DEPTHS:-"1 4 16"}
DURATION=${DURATION:-3s}
CONNS=${CONNS:-32}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
P_UPSTREAM=${P_UPSTREAM:-18281}
P_SERVER=${P_SERVER:-18280}
REDIS_PORT=${REDIS_PORT:-16389}
GATEWAY=${GATEWAY:-"$ROOT/target/profiling/fleet-limiter"}

log() { printf '%s\n' "$*" >&2; }
for tool in redis-server redis-cli wrk nginx curl taskset; do
  command -v "$tool" >/dev/null || { log "missing $tool: apt-get install -y redis-server wrk nginx-light curl util-linux"; exit 1; }
done
if [ "${BUILD:-1}" = 1 ]; then
  (cd "$ROOT" && cargo build --profile profiling --quiet --bin fleet-limiter)
fi
for p in "$P_UPSTREAM" "$P_SERVER" "$REDIS_PORT"; do
  port_free "$p" || { log "port $p is already in use; stop what listens there first"; exit 1; }
done

TMP=$(mktemp -d /tmp/fleet-limiter-redis-calls.XXXXXX)
PIDS=()
trap stop_all EXIT

upstream_nginx_conf "$TMP/nginx-up" "$P_UPSTREAM"
start upstream nginx -c "$TMP/nginx-up/nginx.conf"
wait_up "http://127.0.0.1:$P_UPSTREAM/"
taskset -c "$LOAD_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
  --appendonly no --daemonize no >"$TMP/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }

# info_sum FIELD...: the sum of those fields of INFO stats.
info_sum() {
  rcli info stats | tr -d '\r' | awk -F: -v f=" $* " 'index(f, " " $1 " ") {s += $2} END {print s + 0}'
}
# script_calls, redis_usec: from INFO commandstats.
script_calls() {
  rcli info commandstats | tr -d '\r' | awk -F'[:=,]' '/^cmdstat_(evalsha|eval|fcall)/ {s += $3} END {print s + 0}'
}
redis_usec() {
  rcli info commandstats | tr -d '\r' | awk -F'[:=,]' '/^cmdstat_/ {s += $5} END {print s + 0}'
}

printf '%-8s %-12s %10s %12s %14s %14s %14s\n' depth path "req/s" requests "calls/req" "keys read/req" "Redis µs/req"
for depth in $DEPTHS; do
  for path in allowed refused refused-1key; do
    limit=1000000000 window=1m keys=100000
    [ "$path" != allowed ] && limit=1 window=1h
    [ "$path" = refused-1key ] && keys=1
    printf '[fleet]\nmax_site_endpoints = 1000\n\n[limiters.agent-device]\nlimit = %s\nwindow = "%s"\n\n[limiters.agent-ip]\nlimit = 1000000000\nwindow = "1m"\n' \
      "$limit" "$window" >"$TMP/limits-$path.toml"
    rcli flushall >/dev/null
    start "gw-$depth-$path" env FLEET_LIMITER_LOG=warn FLEET_LIMITER_STORE_CALLS_IN_FLIGHT="$depth" FLEET_LIMITER_MAX_KEYS="$keys" \
      "$GATEWAY" serve --config "$TMP/limits-$path.toml" --listen "127.0.0.1:$P_SERVER" \
      --upstream "http://127.0.0.1:$P_UPSTREAM" --store "redis://127.0.0.1:$REDIS_PORT" \
      --admin-listen 127.0.0.1:0 --allow-unsafe-calibration
    gw=${PIDS[${#PIDS[@]}-1]}
    wait_up "http://127.0.0.1:$P_SERVER/api/agent/heartbeat"
    taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d1s -s "$BENCH/heartbeat.lua" "http://127.0.0.1:$P_SERVER" >/dev/null
    rcli config resetstat >/dev/null
    out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" -s "$BENCH/heartbeat.lua" "http://127.0.0.1:$P_SERVER")
    requests=$(awk '/requests in/ {print $1}' <<<"$out")
    rps=$(awk '/^Requests\/sec/ {printf "%d", $2}' <<<"$out")
    calls=$(script_calls) keys=$(info_sum keyspace_hits keyspace_misses) usec=$(redis_usec)
    kill "$gw" 2>/dev/null || true
    wait "$gw" 2>/dev/null || true
    awk -v d="$depth" -v p="$path" -v rps="$rps" -v n="$requests" -v c="$calls" -v k="$keys" -v u="$usec" \
      'BEGIN {printf "%-8s %-12s %10s %12s %14.3f %14.3f %14.2f\n", d, p, rps, n, c / n, k / n, u / n}'
  done
done
