#!/usr/bin/env bash
# What an https:// upstream costs beside a plain http:// one, with bench/run.sh's harness: the
# same nginx upstream (`return 200 "ok"`) served twice, plain and with TLS (a certificate made
# here by openssl), one gateway in front of each (memory store, budgets nothing exhausts),
# servers on SERVER_CPU and wrk on LOAD_CPU, rounds interleaved; the median of the rounds.
#
#   bench/tls_upstream.sh
#   ROUNDS=8 DURATION=2s bench/tls_upstream.sh
#
# Reuses target/profiling/fleet-limiter when BUILD=0.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH="$ROOT/bench"
# shellcheck source=bench/common.sh
. "$BENCH/common.sh"
DURATION=${DURATION:-2s}
WARMUP=${WARMUP:-1s}
ROUNDS=${ROUNDS:-8}
CONNS=${CONNS:-32}
LAT_CONNS=${LAT_CONNS:-1}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
BUILD=${BUILD:-1}
OUT=${OUT:-"$ROOT/target/bench-results"}
P_PLAIN=18181 P_TLS=18182 P_GW_PLAIN=18180 P_GW_TLS=18183

log() { printf '%s\n' "$*" >&2; }

for tool in wrk nginx openssl taskset curl python3; do
  command -v "$tool" >/dev/null || { log "missing $tool (bench/run.sh installs the others; openssl: apt-get install openssl)"; exit 1; }
done
for port in $P_PLAIN $P_TLS $P_GW_PLAIN $P_GW_TLS; do
  port_free "$port" || { log "port $port is in use; stop what listens there first"; exit 1; }
done
if [ "$BUILD" = 1 ]; then
  log "building the release binary"
  (cd "$ROOT" && cargo build --profile profiling --quiet --bin fleet-limiter)
fi
GATEWAY="$ROOT/target/profiling/fleet-limiter"
mkdir -p "$OUT"

TMP=$(mktemp -d /tmp/fleet-limiter-bench-tls.XXXXXX)
PIDS=()
trap stop_all EXIT

# A CA and a certificate for 127.0.0.1 signed by it.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=bench CA" \
  -keyout "$TMP/ca.key" -out "$TMP/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$TMP/up.key" -out "$TMP/up.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' >"$TMP/san.ext"
openssl x509 -req -in "$TMP/up.csr" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" -CAcreateserial \
  -days 2 -extfile "$TMP/san.ext" -out "$TMP/up.pem" 2>/dev/null

upstream_nginx_conf "$TMP/nginx-plain" "$P_PLAIN"
upstream_nginx_conf "$TMP/nginx-tls" "$P_TLS"
# The same server, with TLS on its listener.
sed -i "s|listen 127.0.0.1:$P_TLS;|listen 127.0.0.1:$P_TLS ssl;\n    ssl_certificate $TMP/up.pem;\n    ssl_certificate_key $TMP/up.key;|" \
  "$TMP/nginx-tls/nginx.conf"
start up-plain nginx -c "$TMP/nginx-plain/nginx.conf"
start up-tls nginx -c "$TMP/nginx-tls/nginx.conf"
wait_up "http://127.0.0.1:$P_PLAIN/"
wait_up "https://127.0.0.1:$P_TLS/"

printf '[limiters.agent-device]\nlimit = 1000000000\nwindow = "1m"\n\n[limiters.agent-ip]\nlimit = 1000000000\nwindow = "1m"\n' >"$TMP/limits.toml"
gateway() {
  local name=$1 port=$2 upstream=$3
  shift 3
  start "$name" env FLEET_LIMITER_LOG=warn "$@" "$GATEWAY" serve --config "$TMP/limits.toml" \
    --listen "127.0.0.1:$port" --upstream "$upstream" --store memory \
    --admin-listen 127.0.0.1:0 --allow-unsafe-calibration
  wait_up "http://127.0.0.1:$port/api/agent/heartbeat"
}
gateway gw-http "$P_GW_PLAIN" "http://127.0.0.1:$P_PLAIN"
gateway gw-https "$P_GW_TLS" "https://127.0.0.1:$P_TLS" FLEET_LIMITER_UPSTREAM_CA_FILE="$TMP/ca.pem"

measure() {
  local port=$1 conns=$2 out
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$conns" -d"$DURATION" --latency \
    -s "$BENCH/heartbeat.lua" "http://127.0.0.1:$port/api/agent/heartbeat")
  printf '%s\n' "$out" >>"$OUT/tls-wrk.log"
  python3 "$BENCH/parse_wrk.py" <<<"$out"
}

: >"$OUT/tls-wrk.log"
results="$OUT/tls-upstream.tsv"
: >"$results"
for port in $P_GW_PLAIN $P_GW_TLS; do
  taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$WARMUP" -s "$BENCH/heartbeat.lua" \
    "http://127.0.0.1:$port/api/agent/heartbeat" >/dev/null
done
log "servers on cpu $SERVER_CPU, wrk on cpu $LOAD_CPU; $ROUNDS rounds x $DURATION, $CONNS connections (latency at $LAT_CONNS)"
for round in $(seq "$ROUNDS"); do
  # Alternate which configuration goes first.
  order=("http:$P_GW_PLAIN" "https:$P_GW_TLS")
  [ $((round % 2)) = 0 ] && order=("https:$P_GW_TLS" "http:$P_GW_PLAIN")
  for entry in "${order[@]}"; do
    name=${entry%%:*} port=${entry#*:}
    m=$(measure "$port" "$CONNS")
    printf '%s\tload\t%s\t%s\n' "$round" "$name" "$m" >>"$results"
    l=$(measure "$port" "$LAT_CONNS")
    printf '%s\tlatency\t%s\t%s\n' "$round" "$name" "$l" >>"$results"
    log "round $round $name: $m | latency: $l"
  done
done

python3 - "$results" "$CONNS" "$LAT_CONNS" <<'PY' | tee "$OUT/tls-upstream.md"
import statistics
import sys

rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
conns, lat_conns = sys.argv[2], sys.argv[3]


def col(kind, name, i):
    return [float(r[3 + i]) for r in rows if r[1] == kind and r[2] == name]


def med(kind, name, i):
    return statistics.median(col(kind, name, i))


rounds = len(col("load", "http", 0))
print(f"| upstream | req/s at {conns} conns (median of {rounds}) | p50 / p99 at {conns} (µs) | p50 / p99 at {lat_conns} conn (µs) | non-2xx |")
print("|---|---|---|---|---|")
for name in ("http", "https"):
    non2xx = sum(int(float(r[6])) for r in rows if r[2] == name)
    print(
        f"| {name}:// | {med('load', name, 0):,.0f} | {med('load', name, 1):.0f} / {med('load', name, 2):.0f}"
        f" | {med('latency', name, 1):.0f} / {med('latency', name, 2):.0f} | {non2xx} |"
    )
# Ratios within a round, then their median.
by_round = {}
for r in rows:
    if r[1] == "load":
        by_round.setdefault(r[0], {})[r[2]] = float(r[3])
ratios = [v["https"] / v["http"] for v in by_round.values() if "http" in v and "https" in v]
lat = {}
for r in rows:
    if r[1] == "latency":
        lat.setdefault(r[0], {})[r[2]] = float(r[4])
lat_ratios = [v["https"] / v["http"] for v in lat.values() if "http" in v and "https" in v]
print()
print(f"https/http throughput ratio (median of per-round ratios): {statistics.median(ratios):.3f}")
print(f"https/http p50 latency ratio at {lat_conns} conn (median of per-round ratios): {statistics.median(lat_ratios):.3f}")
PY
