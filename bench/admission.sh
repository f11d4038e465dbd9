#!/usr/bin/env bash
# What admission control costs an allowed request, with bench/run.sh's harness: the same nginx
# upstream (`return 200 "ok"`) behind two gateways that differ only in `[admission]`, each asked
# for POST /api/agent/heartbeat from 1 000 rotating agents (bench/heartbeat.lua):
#
#   off     admission control off, every limiter counting every answer (the defaults)
#   on      admission control on, its cap (MAX_IN_FLIGHT, 1024) far above the load's CONNS
#           connections: every request takes and gives back a slot, none waits or is shed
#   failed  agent-device counting only failed answers (`count = "failed"`): every 200 the
#           upstream sends is given back to its bucket after the answer
#
# Memory store, budgets nothing exhausts; servers on SERVER_CPU and wrk on LOAD_CPU, rounds
# interleaved (each starting with the other gateway), ratios taken within a round, medians
# reported.
#
#   bench/admission.sh
#   ROUNDS=8 DURATION=2s bench/admission.sh
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
MAX_IN_FLIGHT=${MAX_IN_FLIGHT:-1024}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
BUILD=${BUILD:-1}
OUT=${OUT:-"$ROOT/target/bench-results"}
P_UP=18291 P_OFF=18292 P_ON=18293 P_ON_ADMIN=18294 P_FAILED=18295 P_FAILED_ADMIN=18296

log() { printf '%s\n' "$*" >&2; }

for tool in wrk nginx taskset curl python3; do
  command -v "$tool" >/dev/null || { log "missing $tool (apt-get install wrk nginx-light util-linux curl python3)"; exit 1; }
done
for port in $P_UP $P_OFF $P_ON $P_ON_ADMIN $P_FAILED $P_FAILED_ADMIN; do
  port_free "$port" || { log "port $port is in use; stop what listens there first"; exit 1; }
done
if [ "$BUILD" = 1 ]; then
  log "building the release binary"
  (cd "$ROOT" && cargo build --profile profiling --quiet --bin fleet-limiter)
fi
GATEWAY="$ROOT/target/profiling/fleet-limiter"
mkdir -p "$OUT"

TMP=$(mktemp -d /tmp/fleet-limiter-bench-adm.XXXXXX)
PIDS=()
trap stop_all EXIT

upstream_nginx_conf "$TMP/up" "$P_UP"
start up nginx -c "$TMP/up/nginx.conf"
wait_up "http://127.0.0.1:$P_UP/"

printf '[limiters.agent-device]\nlimit = 1000000000\nwindow = "1m"\n\n[limiters.agent-ip]\nlimit = 1000000000\nwindow = "1m"\n' >"$TMP/limits.toml"
gateway() {
  local name=$1 port=$2 admin=$3
  shift 3
  start "$name" env FLEET_LIMITER_LOG=warn "$@" "$GATEWAY" serve --config "$TMP/limits.toml" \
    --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$P_UP" --store memory \
    --admin-listen "127.0.0.1:$admin" --allow-unsafe-calibration
}
gateway off "$P_OFF" 0
gateway on "$P_ON" "$P_ON_ADMIN" FLEET_LIMITER_ADMISSION_MAX_IN_FLIGHT="$MAX_IN_FLIGHT" FLEET_LIMITER_ADMISSION_QUEUE=0
gateway failed "$P_FAILED" "$P_FAILED_ADMIN" FLEET_LIMITER_LIMITER_AGENT_DEVICE_COUNT=failed
for port in $P_OFF $P_ON $P_FAILED; do
  wait_up "http://127.0.0.1:$port/api/agent/heartbeat"
done
# The `on` gateway must really admit: its metrics carry the default group's gauge.
curl -s "http://127.0.0.1:$P_ON_ADMIN/metrics" | grep -q '^fleet_limiter_admission_in_flight{group="default"}' ||
  { log "the on gateway has no admission metrics: admission control is not on"; exit 1; }
# The `failed` gateway must really give back: its metrics carry agent-device's give-backs.
curl -s "http://127.0.0.1:$P_FAILED_ADMIN/metrics" | grep -q '^fleet_limiter_give_backs_total{limiter="agent-device"' ||
  { log "the failed gateway has no give-back metrics: failure-only counting is not on"; exit 1; }

results="$OUT/admission.tsv"
log "servers on cpu $SERVER_CPU, wrk on cpu $LOAD_CPU; $ROUNDS rounds x $DURATION, $CONNS connections, cap $MAX_IN_FLIGHT"
interleaved_rounds "$results" "$OUT/admission-wrk.log" "off:$P_OFF" "on:$P_ON" "failed:$P_FAILED"

python3 - "$results" "$CONNS" <<'PY' | tee "$OUT/admission.md"
import statistics
import sys

rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
conns = sys.argv[2]


def col(name, i):
    return [float(r[2 + i]) for r in rows if r[1] == name]


rounds = len(col("off", 0))
by_round = {}
for r in rows:
    by_round.setdefault(r[0], {})[r[1]] = float(r[2])
print(f"| gateway | req/s at {conns} conns (median of {rounds}) | p50 / p99 (µs) | non-2xx | req/s / off (median of per-round ratios) |")
print("|---|---|---|---|---|")
for name in ("off", "on", "failed"):
    ratio = statistics.median(v[name] / v["off"] for v in by_round.values() if name in v and "off" in v)
    non2xx = sum(int(float(r[5])) for r in rows if r[1] == name)
    print(
        f"| {name} | {statistics.median(col(name, 0)):,.0f} | {statistics.median(col(name, 1)):.0f} / "
        f"{statistics.median(col(name, 2)):.0f} | {non2xx} | {ratio:.3f} |"
    )
PY
