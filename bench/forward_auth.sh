#!/usr/bin/env bash
# What the decision endpoint costs a proxy that stays in front, with bench/run.sh's harness:
# the same nginx upstream (`return 200 "ok"`) behind three fronts, each asked for POST
# /api/agent/heartbeat from 1 000 rotating agents (bench/heartbeat.lua):
#
#   nginx        nginx proxying to the upstream, no limiter (the floor)
#   nginx+auth   the same nginx with docs/forward-auth/nginx.conf: auth_request to the
#                fleet-limiter decision endpoint before each request is proxied
#   gateway      the fleet-limiter gateway itself in front of the upstream
#
# Memory store, budgets nothing exhausts; servers on SERVER_CPU and wrk on LOAD_CPU, rounds
# interleaved, ratios taken within a round, medians reported.
#
#   bench/forward_auth.sh
#   ROUNDS=8 DURATION=2s bench/forward_auth.sh
#
# Reuses target/profiling/fleet-limiter when BUILD=0.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH="$ROOT/bench"
# shellcheck source=bench/common.sh
. "$BENCH/common.sh"
DURATION=${DURATION:-2s}
WARMUP=${WARMUP:-1s}
ROUNDS=${ROUNDS:-6}
CONNS=${CONNS:-32}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
BUILD=${BUILD:-1}
OUT=${OUT:-"$ROOT/target/bench-results"}
P_UP=18281 P_NGINX=18282 P_AUTH=18283 P_GW=18284 P_DECISION=18285

log() { printf '%s\n' "$*" >&2; }

for tool in wrk nginx taskset curl python3; do
  command -v "$tool" >/dev/null || { log "missing $tool (apt-get install wrk nginx-light util-linux curl python3)"; exit 1; }
done
for port in $P_UP $P_NGINX $P_AUTH $P_GW $P_DECISION; do
  port_free "$port" || { log "port $port is in use; stop what listens there first"; exit 1; }
done
if [ "$BUILD" = 1 ]; then
  log "building the release binary"
  (cd "$ROOT" && cargo build --profile profiling --quiet --bin fleet-limiter)
fi
GATEWAY="$ROOT/target/profiling/fleet-limiter"
mkdir -p "$OUT"

TMP=$(mktemp -d /tmp/fleet-limiter-bench-fa.XXXXXX)
PIDS=()
trap stop_all EXIT

# front DIR PORT SITE: an nginx (one worker, no logging) serving SITE (an http-context file).
front() {
  local dir=$1 port=$2 site=$3
  mkdir -p "$dir"
  cp "$site" "$dir/site.conf"
  cat >"$dir/nginx.conf" <<CONF
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
  include $dir/site.conf;
}
CONF
}

upstream_nginx_conf "$TMP/up" "$P_UP"
start up nginx -c "$TMP/up/nginx.conf"
wait_up "http://127.0.0.1:$P_UP/"

# The plain proxy: one upstream block with keep-alive, as the auth front uses.
cat >"$TMP/plain-site.conf" <<CONF
upstream api { server 127.0.0.1:$P_UP; keepalive 32; }
server {
  listen 127.0.0.1:$P_NGINX;
  location / {
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_pass http://api;
  }
}
CONF
front "$TMP/plain" "$P_NGINX" "$TMP/plain-site.conf"
start nginx nginx -c "$TMP/plain/nginx.conf"

# docs/forward-auth/nginx.conf as written, its addresses changed; the upstream kept alive too.
sed -e "s/127.0.0.1:7392/127.0.0.1:$P_DECISION/; s/listen 80;/listen 127.0.0.1:$P_AUTH;/" \
  -e "s|proxy_pass http://127.0.0.1:3000;|proxy_http_version 1.1;\n        proxy_set_header Connection \"\";\n        proxy_pass http://api;|" \
  "$ROOT/docs/forward-auth/nginx.conf" >"$TMP/auth-site.conf"
printf 'upstream api { server 127.0.0.1:%s; keepalive 32; }\n' "$P_UP" >>"$TMP/auth-site.conf"
front "$TMP/auth" "$P_AUTH" "$TMP/auth-site.conf"
start auth nginx -c "$TMP/auth/nginx.conf"

printf '[limiters.agent-device]\nlimit = 1000000000\nwindow = "1m"\n\n[limiters.agent-ip]\nlimit = 1000000000\nwindow = "1m"\n' >"$TMP/limits.toml"
start fleet env FLEET_LIMITER_LOG=warn FLEET_LIMITER_TRUST_PROXY=127.0.0.1 \
  FLEET_LIMITER_DECISION_ALLOW_FROM=127.0.0.1 "$GATEWAY" serve --config "$TMP/limits.toml" \
  --listen "127.0.0.1:$P_GW" --upstream "http://127.0.0.1:$P_UP" \
  --decision-listen "127.0.0.1:$P_DECISION" --store memory \
  --admin-listen 127.0.0.1:0 --allow-unsafe-calibration
for port in $P_NGINX $P_AUTH $P_GW; do
  wait_up "http://127.0.0.1:$port/api/agent/heartbeat"
done
# The auth front must really be limited: its answer carries the limiter's headers.
curl -s -D - -o /dev/null -X POST -H 'X-Agent-ID: agent-0001' "http://127.0.0.1:$P_AUTH/api/agent/heartbeat" |
  grep -qi '^ratelimit-policy:' || { log "nginx+auth answered without RateLimit-Policy: not asking the limiter"; exit 1; }

results="$OUT/forward-auth.tsv"
log "servers on cpu $SERVER_CPU, wrk on cpu $LOAD_CPU; $ROUNDS rounds x $DURATION, $CONNS connections"
interleaved_rounds "$results" "$OUT/forward-auth-wrk.log" "nginx:$P_NGINX" "nginx+auth:$P_AUTH" "gateway:$P_GW"

python3 - "$results" "$CONNS" <<'PY' | tee "$OUT/forward-auth.md"
import statistics
import sys

rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
conns = sys.argv[2]
names = ("nginx", "nginx+auth", "gateway")


def col(name, i):
    return [float(r[2 + i]) for r in rows if r[1] == name]


rounds = len(col("nginx", 0))
print(f"| front | req/s at {conns} conns (median of {rounds}) | p50 / p99 (µs) | non-2xx | req/s / nginx alone (median of per-round ratios) |")
print("|---|---|---|---|---|")
by_round = {}
for r in rows:
    by_round.setdefault(r[0], {})[r[1]] = float(r[2])
for name in names:
    ratio = statistics.median(v[name] / v["nginx"] for v in by_round.values() if name in v and "nginx" in v)
    non2xx = sum(int(float(r[5])) for r in rows if r[1] == name)
    print(
        f"| {name} | {statistics.median(col(name, 0)):,.0f} | {statistics.median(col(name, 1)):.0f} / "
        f"{statistics.median(col(name, 2)):.0f} | {non2xx} | {ratio:.3f} |"
    )
PY
