# Helpers shared by bench/run.sh and bench/callgrind.sh (sourced, not run).

# port_free PORT: nothing listens on 127.0.0.1:PORT yet. A server left over from something else
# would otherwise answer in place of the one a script starts (which then fails to bind).
port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# upstream_nginx_conf DIR PORT: the upstream every proxy row fronts (nginx `return 200 "ok"`
# on 127.0.0.1:PORT, one worker, no logging), written to DIR/nginx.conf.
upstream_nginx_conf() {
  local dir=$1 port=$2
  mkdir -p "$dir"
  cat >"$dir/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log stderr error;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir;
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:$port;
    location / { return 200 "ok"; }
  }
}
CONF
}

# The background servers of a load script: `start NAME CMD...` runs CMD pinned to SERVER_CPU
# with its output in $TMP/NAME.log and remembers its pid in PIDS; `stop_all` (the scripts'
# EXIT trap) stops them and removes $TMP; `wait_up URL` waits until something answers there
# (any status), at most 15 s.
start() {
  local name=$1
  shift
  taskset -c "$SERVER_CPU" "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
}

stop_all() {
  local p
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}

wait_up() {
  local i
  for i in $(seq 150); do
    curl -sk -o /dev/null -X POST "$1" && return 0
    sleep 0.1
  done
  printf 'nothing answers at %s\n' "$1" >&2
  return 1
}

# `interleaved_rounds RESULTS WRK_LOG NAME:PORT...`: warm each server up for WARMUP, then
# ROUNDS rounds of one `wrk` run (CONNS connections, DURATION, heartbeat.lua, on LOAD_CPU)
# against each server in turn, each round starting one server further along so that none
# always runs in the same slot. Appends `round<TAB>name<TAB>parse_wrk.py's fields` to RESULTS
# and wrk's own output to WRK_LOG.
interleaved_rounds() {
  local results=$1 wrk_log=$2
  shift 2
  local entries=("$@") n=$# round i k entry name port out m
  : >"$results"
  : >"$wrk_log"
  for entry in "${entries[@]}"; do
    taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$WARMUP" -s "$BENCH/heartbeat.lua" \
      "http://127.0.0.1:${entry#*:}/api/agent/heartbeat" >/dev/null
  done
  for round in $(seq "$ROUNDS"); do
    k=$(((round - 1) % n))
    for i in $(seq 0 $((n - 1))); do
      entry=${entries[$(((k + i) % n))]}
      name=${entry%%:*} port=${entry#*:}
      out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --latency \
        -s "$BENCH/heartbeat.lua" "http://127.0.0.1:$port/api/agent/heartbeat")
      printf '%s\n' "$out" >>"$wrk_log"
      m=$(python3 "$BENCH/parse_wrk.py" <<<"$out")
      printf '%s\t%s\t%s\n' "$round" "$name" "$m" >>"$results"
      printf 'round %s %s: %s\n' "$round" "$name" "$m" >&2
    done
  done
}

# nginx_limit_conf RATE PORT DIR: nginx as reverse proxy in front of the upstream on
# $P_UPSTREAM (keep-alive to it), with limit_req keyed on client address + X-Agent-ID at RATE
# (`nodelay`, 429); RATE `none` leaves limit_req out (the plain proxy). The configuration
# lands in DIR/nginx.conf.
nginx_limit_conf() {
  local dir=$3 zone="" limit=""
  if [ "$1" != none ]; then
    zone="limit_req_zone \"\$binary_remote_addr:\$agent\" zone=agent:64m rate=$1;
  limit_req_status 429;"
    limit="limit_req zone=agent nodelay;"
  fi
  mkdir -p "$dir"
  cat >"$dir/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log stderr error;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir;
  proxy_temp_path $dir;
  keepalive_requests 100000000;
  map \$http_x_agent_id \$agent { default \$http_x_agent_id; "" none; }
  $zone
  upstream api { server 127.0.0.1:$P_UPSTREAM; keepalive 64; }
  server {
    listen 127.0.0.1:$2;
    location / {
      $limit
      proxy_pass http://api;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
}

# allowed_limits FILE: budgets nothing exhausts, so every measured request takes the allowed
# path. The site is as large as the load script's 1 000 agents, so the agent-ip ceiling knows
# each after its first request.
allowed_limits() {
  cat >"$1" <<EOF
[fleet]
max_site_endpoints = 1000

[limiters.agent-device]
limit = 1000000000
window = "1m"

[limiters.agent-ip]
limit = 1000000000
window = "1m"
EOF
}

# server_command MODE: the server of MODE (bench/callgrind.sh's modes), listening on P_SERVER
# and proxying to P_UPSTREAM, into the array CMD, and its environment into ENVS (set outside
# valgrind, which would otherwise profile `env` itself). Reads TMP, GATEWAY and MW; the
# budgets are $TMP/limits.toml (allowed_limits).
server_command() {
  local listen="127.0.0.1:$P_SERVER"
  case $1 in
    on | off)
      local enabled=true
      [ "$1" = off ] && enabled=false
      ENVS=(FLEET_LIMITER_LOG=warn FLEET_LIMITER_ENABLED=$enabled)
      CMD=("$GATEWAY" serve
        --config "$TMP/limits.toml" --listen "$listen" --upstream "http://127.0.0.1:$P_UPSTREAM"
        --store memory --admin-listen 127.0.0.1:0 --allow-unsafe-calibration) ;;
    shaped)
      # `on`, with the heartbeat shaped (poll slots), the upstream watched against a target it
      # keeps, and exports capped: what [shaping] adds to each request.
      cat "$TMP/limits.toml" - >"$TMP/shaped.toml" <<'TOML'

[shaping.upstream]
latency_target = "250ms"

[shaping.routes.heartbeat]
routes = ["POST /api/agent/heartbeat"]
interval = "60s"
max_interval = "90s"
priority = "critical"

[shaping.routes.exports]
routes = ["GET /api/export/**"]
priority = "low"
max_in_flight = 4
TOML
      ENVS=(FLEET_LIMITER_LOG=warn)
      CMD=("$GATEWAY" serve
        --config "$TMP/shaped.toml" --listen "$listen" --upstream "http://127.0.0.1:$P_UPSTREAM"
        --store memory --admin-listen 127.0.0.1:0 --allow-unsafe-calibration) ;;
    hdr-*)
      local profile=${1#hdr-} legacy=false reset=unix
      case $profile in
        *-legacy-delta) legacy=true reset=delta profile=${profile%-legacy-delta} ;;
        *-legacy) legacy=true profile=${profile%-legacy} ;;
      esac
      ENVS=(FLEET_LIMITER_LOG=warn FLEET_LIMITER_HEADERS_STANDARD="$profile"
        FLEET_LIMITER_HEADERS_LEGACY=$legacy FLEET_LIMITER_HEADERS_LEGACY_RESET=$reset)
      CMD=("$GATEWAY" serve
        --config "$TMP/limits.toml" --listen "$listen" --upstream "http://127.0.0.1:$P_UPSTREAM"
        --store memory --admin-listen 127.0.0.1:0 --allow-unsafe-calibration) ;;
    decision)
      ENVS=(FLEET_LIMITER_LOG=warn FLEET_LIMITER_TRUST_PROXY=127.0.0.1 FLEET_LIMITER_DECISION_ALLOW_FROM=127.0.0.1)
      CMD=("$GATEWAY" serve --config "$TMP/limits.toml" --decision-listen "$listen"
        --store memory --admin-listen 127.0.0.1:0 --allow-unsafe-calibration) ;;
    nginx-limit | nginx-proxy)
      local rate=1000000r/s
      [ "$1" = nginx-proxy ] && rate=none
      nginx_limit_conf "$rate" "$P_SERVER" "$TMP/$1"
      ENVS=() CMD=(nginx -c "$TMP/$1/nginx.conf" -g "master_process off;") ;;
    mw-fleet) ENVS=(FLEET_LIMITER_LOG=warn) CMD=("$MW" fleet "$TMP/limits.toml" "$listen") ;;
    mw-governor) ENVS=() CMD=("$MW" governor allowed "$listen") ;;
    mw-bare) ENVS=() CMD=("$MW" bare - "$listen") ;;
  esac
}
