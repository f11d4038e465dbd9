#!/usr/bin/env bash
# Side-by-side load benchmark over loopback: fleet-limiter against the tools an operator would
# otherwise pick. See docs/benchmarks.md for what each row is and how to read the table.
#
#   bench/run.sh                 # everything: install, build, load table, memory per key
#   ROUNDS=12 DURATION=3s bench/run.sh
#   ONLY=load bench/run.sh       # skip the memory measurements (ONLY=memory for the reverse)
#
# Allowed-path rounds also measure latency at LAT_CONNS (1) connection: the time a request
# takes through each configuration without queueing behind 31 others.
#
# Servers run on SERVER_CPU, wrk on LOAD_CPU (taskset). Every configuration's server is started
# twice, once with budgets nothing exhausts (the allowed path) and once with budgets every
# measured request exceeds (the refusal path), and warmed up; then rounds interleave short wrk
# runs over all of them (every server once per round, each round starting one server further
# along), so that bursts of outside load on a shared machine hit neighbouring measurements
# alike; ratios are taken within a round.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH="$ROOT/bench"
# shellcheck source=bench/common.sh
. "$BENCH/common.sh"
DURATION=${DURATION:-2s}
WARMUP=${WARMUP:-1s}
ROUNDS=${ROUNDS:-8}
CONNS=${CONNS:-32}
WRK_THREADS=${WRK_THREADS:-1}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
MEM_KEYS=${MEM_KEYS:-1000000}
ONLY=${ONLY:-all}
REDIS_PORT=${REDIS_PORT:-16379}
REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
# A second private Redis, pinned to the load core: the Redis store without Redis's own CPU
# on the server core (as when Redis runs on its own machine).
REDIS_APART_PORT=$((REDIS_PORT + 1))
REDIS_APART_URL="redis://127.0.0.1:$REDIS_APART_PORT"
# Unloaded latency: each allowed-path round also measures these at LAT_CONNS connections.
LAT_CONNS=${LAT_CONNS:-1}
LAT_LIST=(upstream gateway-on gateway-off gateway-redis gateway-redis-apart nginx-limit mw-fleet mw-governor mw-bare)
OUT=${OUT:-"$ROOT/target/bench-results"}

P_UPSTREAM=18081 P_GATEWAY=18080 P_NGINX=18082

log() { printf '%s\n' "$*" >&2; }

# ---------------------------------------------------------------- install what is missing
install_tools() {
  local apt=()
  command -v wrk >/dev/null || apt+=(wrk)
  command -v nginx >/dev/null || apt+=(nginx-light)
  command -v redis-server >/dev/null || apt+=(redis-server)
  command -v node >/dev/null || apt+=(nodejs)
  command -v npm >/dev/null || apt+=(npm)
  command -v taskset >/dev/null || apt+=(util-linux)
  command -v curl >/dev/null || apt+=(curl)
  command -v python3 >/dev/null || apt+=(python3)
  if ((${#apt[@]})); then
    log "installing: ${apt[*]}"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${apt[@]}" >/dev/null
  fi
  if [ ! -d "$BENCH/node/node_modules/express-rate-limit" ]; then
    log "installing node packages (npm ci in bench/node)"
    (cd "$BENCH/node" && npm ci --no-audit --no-fund --silent)
  fi
}

build() {
  log "building release binaries"
  (cd "$ROOT" && cargo build --profile profiling --quiet --bin fleet-limiter --example memory_per_key)
  # The middleware apps are their own cargo project (actix-governor stays out of the crate);
  # sharing the target directory reuses the crate's compiled dependencies.
  (cd "$BENCH/middleware" && CARGO_TARGET_DIR="$ROOT/target" cargo build --profile profiling --quiet --bins)
  GATEWAY="$ROOT/target/profiling/fleet-limiter"
  MW="$ROOT/target/profiling/fleet-limiter-bench-middleware"
}

# ---------------------------------------------------------------- process helpers
TMP=$(mktemp -d /tmp/fleet-limiter-bench.XXXXXX)
PIDS=()
REDIS_PIDS=()
cleanup() {
  stop_all
  local p
  for p in "${REDIS_PIDS[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  rm -rf "$TMP"
}
trap cleanup EXIT

# start NAME CMD...: run CMD pinned to the server core, remember its pid.
start() {
  local name=$1
  shift
  taskset -c "$SERVER_CPU" "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
}

stop_all() {
  local p
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null || true
  done
  PIDS=()
}

# wait_up PORT: until something answers HTTP on the port (any status), at most 15 s; fails
# at once when the process started last has exited.
wait_up() {
  local i last=${PIDS[${#PIDS[@]}-1]}
  for i in $(seq 150); do
    if curl -s -o /dev/null -X POST "http://127.0.0.1:$1/api/agent/heartbeat"; then return 0; fi
    kill -0 "$last" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# ---------------------------------------------------------------- configurations
# The limiters the built-in calibration has (agent-ip exists only in some versions).
builtin_limiters() {
  grep -o 'name: "[a-z0-9_-]*"' "$ROOT/src/config/defaults.rs" | cut -d'"' -f2
}

# config FILE LIMIT WINDOW: raise (or drop) the budgets that meter a heartbeat.
write_config() {
  local file=$1 limit=$2 window=$3 name
  # A site as large as the load script's 1 000 agents, so the agent-ip ceiling knows them all.
  printf '[fleet]\nmax_site_endpoints = 1000\n\n' >"$file"
  for name in agent-device agent-ip; do
    if builtin_limiters | grep -qx "$name"; then
      printf '[limiters.%s]\nlimit = %s\nwindow = "%s"\n\n' "$name" "$limit" "$window" >>"$file"
    fi
  done
}

start_upstream() {
  if ! port_free "$P_UPSTREAM"; then
    log "port $P_UPSTREAM (the upstream's) is already in use; stop what listens there first"
    exit 1
  fi
  upstream_nginx_conf "$TMP/nginx-up" "$P_UPSTREAM"
  start upstream nginx -c "$TMP/nginx-up/nginx.conf"
  wait_up "$P_UPSTREAM"
}

# start_redis PORT CPU: a private redis-server pinned to CPU.
start_redis() {
  local port=$1 cpu=$2
  command -v redis-server >/dev/null || return 1
  if ! port_free "$port"; then
    log "port $port is already in use: not starting a redis-server there"
    return 1
  fi
  taskset -c "$cpu" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no >"$TMP/redis-$port.log" 2>&1 &
  REDIS_PIDS+=($!)
  local i
  for i in $(seq 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

redis_flush() {
  local port
  for port in "$REDIS_PORT" "$REDIS_APART_PORT"; do
    redis-cli -p "$port" flushall >/dev/null 2>&1 || true
  done
}

# port_of CONFIG [PATH_KIND]: each server's own port (the refusal path's 100 above the
# allowed one's): every server runs at once, idle but for the one being loaded, so
# consecutive measurements are seconds apart.
port_of() {
  local base
  base=$(base_port_of "$1")
  if [ "${2:-allowed}" = refused ]; then echo $((base + 100)); else echo "$base"; fi
}

base_port_of() {
  case $1 in
    upstream) echo "$P_UPSTREAM" ;;
    gateway-on) echo 18080 ;;
    gateway-off) echo 18083 ;;
    gateway-redis) echo 18084 ;;
    gateway-redis-apart) echo 18085 ;;
    nginx-limit) echo "$P_NGINX" ;;
    mw-fleet) echo 18090 ;;
    mw-governor) echo 18092 ;;
    mw-bare) echo 18093 ;;
    express-memory) echo 18091 ;;
    express-redis) echo 18094 ;;
  esac
}

# launch CONFIG PATH_KIND: start CONFIG's server (the upstream is already up), or fail with
# a reason in $TMP/skip. PATH_KIND is allowed (nothing refused) or refused (one per hour).
launch() {
  local cfg=$1 kind=$2 conf="$TMP/limits-$2.toml" port name="$1-$2"
  port=$(port_of "$cfg" "$kind")
  if [ "$cfg" != upstream ] && ! port_free "$port"; then
    echo "port $port is already in use by another process" >"$TMP/skip"
    return 1
  fi
  local limit=1000000000 window=1m erl_limit=1000000000 erl_window=60000 rate=1000000r/s
  # The two paths' servers run side by side: the refusal path's keep their buckets in Redis
  # database 1, apart from the allowed path's.
  local redis_url=$REDIS_URL
  if [ "$kind" = refused ]; then
    limit=1 window=1h erl_limit=1 erl_window=3600000 rate=1r/m redis_url="$REDIS_URL/1"
  fi
  write_config "$conf" "$limit" "$window"
  case $cfg in
    upstream) return 0 ;;
    gateway-on | gateway-off | gateway-redis | gateway-redis-apart)
      local store=(--store memory) env=(env FLEET_LIMITER_LOG=warn)
      [ "$cfg" = gateway-off ] && env+=(FLEET_LIMITER_ENABLED=false)
      [ "$cfg" = gateway-redis ] && store=(--store "$redis_url")
      [ "$cfg" = gateway-redis-apart ] && store=(--store "$REDIS_APART_URL")
      # The refusal run's one-an-hour budget is deliberately unsafe for a fleet; every gateway
      # gets its own admin port.
      start "$name" "${env[@]}" "$GATEWAY" serve --config "$conf" --listen "127.0.0.1:$port" \
        --upstream "http://127.0.0.1:$P_UPSTREAM" "${store[@]}" \
        --admin-listen 127.0.0.1:0 --allow-unsafe-calibration ;;
    nginx-limit)
      nginx_limit_conf "$rate" "$port" "$TMP/nginx-lim-$kind"
      start "$name" nginx -c "$TMP/nginx-lim-$kind/nginx.conf" ;;
    mw-fleet) start "$name" env FLEET_LIMITER_LOG=warn "$MW" fleet "$conf" "127.0.0.1:$port" ;;
    mw-governor) start "$name" "$MW" governor "$kind" "127.0.0.1:$port" ;;
    mw-bare) start "$name" "$MW" bare - "127.0.0.1:$port" ;;
    express-memory) start "$name" env NODE_ENV=production node "$BENCH/node/server.js" "$port" memory "$erl_limit" "$erl_window" ;;
    express-redis) start "$name" env NODE_ENV=production node "$BENCH/node/server.js" "$port" "$redis_url" "$erl_limit" "$erl_window" ;;
  esac
  if ! wait_up "$port"; then
    sed -n '1,5p' "$TMP/$name.log" >"$TMP/skip"
    return 1
  fi
}

# measure PORT [CONNECTIONS]: wrk on the load core; prints "rps p50_us p99_us non2xx total".
measure() {
  local port=$1 conns=${2:-$CONNS} out
  out=$(taskset -c "$LOAD_CPU" wrk -t"$WRK_THREADS" -c"$conns" -d"$DURATION" --latency \
    -s "$BENCH/heartbeat.lua" "http://127.0.0.1:$port/api/agent/heartbeat")
  printf '%s\n' "$out" >>"$OUT/wrk.log"
  python3 "$BENCH/parse_wrk.py" <<<"$out"
}

# ---------------------------------------------------------------- the load table
run_load() {
  local allowed=(upstream gateway-on gateway-off gateway-redis gateway-redis-apart nginx-limit mw-fleet mw-governor mw-bare express-memory express-redis)
  local refused=(gateway-on gateway-redis nginx-limit mw-fleet mw-governor express-memory express-redis)
  local results="$OUT/results.tsv" round cfg kind
  : >"$results"
  : >"$OUT/wrk.log"
  : >"$OUT/skip-reasons.txt"
  start_redis "$REDIS_PORT" "$SERVER_CPU" || log "redis-server unavailable: Redis rows will be skipped"
  start_redis "$REDIS_APART_PORT" "$LOAD_CPU" || log "second redis-server unavailable"
  redis_flush
  start_upstream
  local up=()
  for kind in allowed refused; do
    local list=("${allowed[@]}")
    [ "$kind" = refused ] && list=("${refused[@]}")
    for cfg in "${list[@]}"; do
      [ "$cfg" = upstream ] && { up+=("$kind:$cfg"); continue; }
      rm -f "$TMP/skip"
      if ! launch "$cfg" "$kind"; then
        local why="did not start"
        [ -s "$TMP/skip" ] && why=$(tr '\n' ' ' <"$TMP/skip")
        log "SKIPPING $cfg ($kind): $why"
        grep -q "^$cfg	" "$OUT/skip-reasons.txt" || printf '%s\t%s\n' "$cfg" "$why" >>"$OUT/skip-reasons.txt"
        continue
      fi
      # Warm up (and, on the refusal path, spend each agent's single request).
      taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$WARMUP" -s "$BENCH/heartbeat.lua" \
        "http://127.0.0.1:$(port_of "$cfg" "$kind")/api/agent/heartbeat" >/dev/null
      up+=("$kind:$cfg")
    done
  done
  # Each round starts one configuration further along the list, so that no configuration
  # always runs in the same slot (right after the upstream alone, say, or last).
  local n=${#up[@]} order
  for round in $(seq "$ROUNDS"); do
    local entry i
    order=()
    for i in $(seq 0 $((n - 1))); do
      order+=("${up[$(((i + round - 1) % n))]}")
    done
    for entry in "${order[@]}"; do
      kind=${entry%%:*} cfg=${entry#*:}
      local m port
      port=$(port_of "$cfg" "$kind")
      m=$(measure "$port")
      printf '%s\t%s\t%s\t%s\n' "$round" "$kind" "$cfg" "$m" >>"$results"
      log "round $round $kind $cfg: $m"
      if [ "$kind" = allowed ] && [[ " ${LAT_LIST[*]} " == *" $cfg "* ]]; then
        m=$(measure "$port" "$LAT_CONNS")
        printf '%s\t%s\t%s\t%s\n' "$round" latency "$cfg" "$m" >>"$results"
        log "round $round latency $cfg: $m"
      fi
    done
  done
  stop_all
  python3 "$BENCH/table.py" "$results" "$OUT/skip-reasons.txt" "$CONNS" "$LAT_CONNS" | tee "$OUT/table.md"
}

# ---------------------------------------------------------------- memory per key
run_memory() {
  {
    echo "### Memory per tracked key ($MEM_KEYS keys)"
    echo
    echo '```'
    "$ROOT/target/profiling/examples/memory_per_key" "$MEM_KEYS"
    "$ROOT/target/profiling/governor_memory" "$MEM_KEYS" ip+agent
    "$ROOT/target/profiling/governor_memory" "$MEM_KEYS" digest
    node --expose-gc "$BENCH/node/memory.js" "$MEM_KEYS"
    redis_memory
    echo '```'
  } | tee "$OUT/memory.md"
}

# Bytes per key in Redis: fill it through the gateway's Redis store with distinct agents.
redis_memory() {
  if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && ! start_redis "$REDIS_PORT" "$SERVER_CPU"; then
    echo "redis: redis-server unavailable, not measured"
    return
  fi
  # Buckets must outlive the fill: each agent's bucket is 3 per 15 min, so one request leaves a
  # key that expires after 5 min (deliberately unsafe for a fleet, hence the override below).
  # The per-IP ceiling, one key for all of them, is raised out of the way.
  local conf="$TMP/limits-mem.toml"
  printf '[limiters.agent-device]\nlimit = 3\nwindow = "15m"\n\n[limiters.agent-ip]\nlimit = 1000000000\nwindow = "15m"\n' >"$conf"
  redis_flush
  start_upstream
  start gateway env FLEET_LIMITER_LOG=warn "$GATEWAY" serve --config "$conf" --listen "127.0.0.1:$P_GATEWAY" \
    --upstream "http://127.0.0.1:$P_UPSTREAM" --store "$REDIS_URL" --admin-listen 127.0.0.1:0 \
    --allow-unsafe-calibration
  if ! wait_up "$P_GATEWAY"; then
    echo "redis: not measured: the gateway refuses the Redis store: $(head -1 "$TMP/gateway.log")"
    stop_all
    return
  fi
  local before after keys
  before=$(redis-cli -p "$REDIS_PORT" info memory | tr -d '\r' | awk -F: '/^used_memory:/{print $2}')
  BENCH_KEYS=$MEM_KEYS taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${MEM_FILL_SECONDS:-150}s" -s "$BENCH/unique.lua" \
    "http://127.0.0.1:$P_GATEWAY/api/agent/heartbeat" >/dev/null
  after=$(redis-cli -p "$REDIS_PORT" info memory | tr -d '\r' | awk -F: '/^used_memory:/{print $2}')
  keys=$(redis-cli -p "$REDIS_PORT" dbsize)
  stop_all
  python3 -c "b,a,k=$before,$after,$keys; print(f'redis store: {k} keys, used_memory +{(a-b)/1048576:.1f} MiB, {(a-b)/max(k,1):.1f} bytes per key')"
}

main() {
  mkdir -p "$OUT"
  install_tools
  build
  log "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  log "servers on cpu $SERVER_CPU, wrk on cpu $LOAD_CPU; $ROUNDS rounds x $DURATION, $CONNS connections"
  case $ONLY in
    load) run_load ;;
    memory) run_memory ;;
    *) run_load; run_memory ;;
  esac
  log "results in $OUT"
}

main "$@"
