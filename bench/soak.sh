#!/usr/bin/env bash
# Soak at the cap: the release gateway under saturating load for DURATION, every request from a
# new agent id (a new bucket each) with a small store.max_keys, so that eviction runs all the
# time. Every INTERVAL seconds it samples the gateway's RSS, the p99 latency of the interval,
# the answers by status, the store's tracked and evicted keys, and a few probe principals whose
# buckets must stay exact. Writes samples.csv and summary.txt to OUT, and exits non-zero when
# memory or p99 grew beyond the tolerance, a probe's bucket was inexact, anything answered 5xx,
# a request got no answer, the store failed a decision, or (memory store) nothing was evicted
# (bench/soak_report.py judges). Not a CI test: it takes
# hours by default.
#
#   bench/soak.sh                               # memory store, 2 hours
#   DURATION=30m STORE=redis bench/soak.sh      # Redis store (a private redis-server)
#   DURATION=5m bench/soak.sh                   # a short smoke
#
# Settings (environment): DURATION (2h; s, m or h), STORE (memory | redis), INTERVAL (10,
# seconds per sample), WARMUP (60, seconds left out of first-versus-last), MAX_KEYS (20000),
# CONNS (32 wrk connections), PROBES (4), PROBE_RATE (5 requests a second each),
# RSS_TOLERANCE (1.25), P99_TOLERANCE (2), SERVER_CPU (1: gateway, upstream, Redis),
# LOAD_CPU (0: wrk and the probes), BIN (a built binary; default: build the release one),
# OUT (target/soak/<store>-<time>), PORT_BASE (18280: the gateway's port; the admin listener,
# the upstream and Redis take the next three, so two soaks can run side by side).
#
# The load: wrk runs back to back, one INTERVAL each, POST /api/agent/heartbeat with
# X-Agent-ID never repeated (bench/soak.lua). The built-in agent-ip ceiling is lifted so that
# every new id is admitted (by default it admits 250 a minute per address and the rest are
# refused without a bucket): each request then leaves an agent-device bucket (30 a minute,
# full again 2 s after one request) and a known-agents entry behind. On the memory store the
# buckets are capped by store.max_keys, so it evicts all the time; on Redis they expire there
# when full again, and Redis's used_memory is sampled and held to the RSS tolerance. The probes (bench/soak_probe.py) are metered by their own fixed-window
# limiter (1 000 000 a week): their buckets are full again only in a week, so the eviction
# (which drops the bucket that would be full again soonest, of a sample of 32) never picks
# them, and what is left after their k-th request is exactly 1 000 000 - k.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH="$ROOT/bench"
# shellcheck source=bench/common.sh
. "$BENCH/common.sh"

DURATION=${DURATION:-2h}
STORE=${STORE:-memory}
INTERVAL=${INTERVAL:-10}
WARMUP=${WARMUP:-60}
MAX_KEYS=${MAX_KEYS:-20000}
CONNS=${CONNS:-32}
PROBES=${PROBES:-4}
PROBE_RATE=${PROBE_RATE:-5}
PROBE_LIMIT=1000000
RSS_TOLERANCE=${RSS_TOLERANCE:-1.25}
P99_TOLERANCE=${P99_TOLERANCE:-2}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
OUT=${OUT:-"$ROOT/target/soak/$STORE-$(date -u +%Y%m%dT%H%M%SZ)"}
PORT_BASE=${PORT_BASE:-18280}
P_GATEWAY=$PORT_BASE P_ADMIN=$((PORT_BASE + 1)) P_UPSTREAM=$((PORT_BASE + 2)) P_REDIS=$((PORT_BASE + 3))

log() { printf '%s\n' "$*" >&2; }

seconds() {
  local v=$1
  case $v in
    *h) echo $((${v%h} * 3600)) ;;
    *m) echo $((${v%m} * 60)) ;;
    *s) echo "${v%s}" ;;
    *) echo "$v" ;;
  esac
}
TOTAL=$(seconds "$DURATION")

case $STORE in
  memory | redis) ;;
  *)
    log "STORE must be memory or redis, not $STORE"
    exit 2
    ;;
esac

apt=()
command -v wrk >/dev/null || apt+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || apt+=(nginx-light)
command -v curl >/dev/null || apt+=(curl)
command -v taskset >/dev/null || apt+=(util-linux)
if [ "$STORE" = redis ]; then command -v redis-server >/dev/null || apt+=(redis-server); fi
if ((${#apt[@]})); then
  log "installing: ${apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

if [ -z "${BIN:-}" ]; then
  log "building the release binary"
  (cd "$ROOT" && cargo build --release --quiet --bin fleet-limiter)
  BIN="$ROOT/target/release/fleet-limiter"
fi

for p in $P_GATEWAY $P_ADMIN $P_UPSTREAM $P_REDIS; do
  port_free "$p" || {
    log "port $p is taken: stop what listens there"
    exit 1
  }
done

mkdir -p "$OUT"
TMP=$(mktemp -d)
PIDS=()
trap stop_all EXIT

upstream_nginx_conf "$TMP/nginx" "$P_UPSTREAM"
start upstream "$NGINX" -c "$TMP/nginx/nginx.conf"

store_toml="[store]
max_keys = $MAX_KEYS"
if [ "$STORE" = redis ]; then
  start redis redis-server --port "$P_REDIS" --bind 127.0.0.1 --save "" --appendonly no
  for _ in $(seq 50); do
    redis-cli -p "$P_REDIS" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  store_toml="$store_toml
url = \"redis://127.0.0.1:$P_REDIS\""
fi

cat >"$OUT/soak.toml" <<TOML
$store_toml

# Every request is a new agent id from one address: admit them all, so each leaves a bucket.
[limiters.agent-ip]
limit = 4000000000

# The probes: a fixed window of a week, nothing refills during the soak.
[limiters.soak-probe]
limit = $PROBE_LIMIT
window = "7d"
algorithm = "fixed-window"
key = "ip+agent"
routes = ["/probe/**"]

# The address ceiling an agent-id key needs, far above what the probes send.
[limiters.soak-probe-ip]
limit = 4000000000
window = "1m"
key = "ip"
routes = ["/probe/**"]
TOML

start gateway env FLEET_LIMITER_LOG=warn FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION=true \
  "$BIN" serve --config "$OUT/soak.toml" --listen "127.0.0.1:$P_GATEWAY" \
  --admin-listen "127.0.0.1:$P_ADMIN" --upstream "http://127.0.0.1:$P_UPSTREAM"
GATEWAY_PID=${PIDS[-1]}
wait_up "http://127.0.0.1:$P_ADMIN/healthz"
wait_up "http://127.0.0.1:$P_GATEWAY/probe/up"

RUN_ID=$RANDOM
taskset -c "$LOAD_CPU" python3 "$BENCH/soak_probe.py" 127.0.0.1 "$P_GATEWAY" "$PROBES" \
  "$PROBE_RATE" "$PROBE_LIMIT" "$RUN_ID" "$TMP/probe.json" >"$TMP/probe.log" 2>&1 &
PROBE_PID=$!
PIDS+=("$PROBE_PID")

{
  printf 'DURATION=%s STORE=%s INTERVAL=%s WARMUP=%s MAX_KEYS=%s CONNS=%s PROBES=%s PROBE_RATE=%s ' \
    "$DURATION" "$STORE" "$INTERVAL" "$WARMUP" "$MAX_KEYS" "$CONNS" "$PROBES" "$PROBE_RATE"
  printf 'RSS_TOLERANCE=%s P99_TOLERANCE=%s SERVER_CPU=%s LOAD_CPU=%s PORT_BASE=%s bench/soak.sh\n' \
    "$RSS_TOLERANCE" "$P99_TOLERANCE" "$SERVER_CPU" "$LOAD_CPU" "$PORT_BASE"
  printf 'binary: %s (%s)\n' "$BIN" "$("$BIN" --version)"
  printf 'started: %s\n' "$(date -u +%FT%TZ)"
} >"$OUT/command.txt"

metric() {
  # metric TEXT NAME: the value of the first sample line starting with NAME (0 when absent).
  awk -v n="$2" 'index($0, n) == 1 { print $NF; found = 1; exit } END { if (!found) print 0 }' <<<"$1"
}

csv="$OUT/samples.csv"
echo "t_s,rss_kib,rps,p50_us,p99_us,requests,s2xx,s429,s5xx,sother,socket_errors,tracked_keys,evicted_keys,known_agents_evicted,probe_checks,probe_inexact,probe_max_drift,probe_errors,probe_5xx,redis_used_kib,store_errors" >"$csv"
log "soak: $STORE store, max_keys $MAX_KEYS, $DURATION, a sample every ${INTERVAL}s; writing $OUT"
begin=$(date +%s)
run=0
while (($(date +%s) - begin < TOTAL)); do
  run=$((run + 1))
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${INTERVAL}s" --latency -s "$BENCH/soak.lua" \
    "http://127.0.0.1:$P_GATEWAY/api/agent/heartbeat" -- "$RUN_ID$run")
  t=$(($(date +%s) - begin))
  kill -0 "$GATEWAY_PID" 2>/dev/null || {
    log "the gateway exited"
    exit 1
  }
  read -r rps p50 p99 _ total < <(python3 "$BENCH/parse_wrk.py" <<<"$out" 2>/dev/null)
  read -r s2xx s429 s5xx sother < <(sed -n 's/^statuses 2xx=\([0-9]*\) 429=\([0-9]*\) 5xx=\([0-9]*\) other=\([0-9]*\)$/\1 \2 \3 \4/p' <<<"$out")
  sock=$(sed -n 's/^ *Socket errors: connect \([0-9]*\), read \([0-9]*\), write \([0-9]*\), timeout \([0-9]*\)$/\1 \2 \3 \4/p' <<<"$out" | awk '{ print $1 + $2 + $3 + $4 }')
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$GATEWAY_PID/status")
  m=$(curl -s "http://127.0.0.1:$P_ADMIN/metrics")
  tracked=$(metric "$m" "fleet_limiter_tracked_keys{")
  evicted=$(metric "$m" "fleet_limiter_evicted_keys_total{")
  known_evicted=$(awk '/^fleet_limiter_known_agents_evicted_total\{/ { s += $NF } END { print s + 0 }' <<<"$m")
  # Decisions the store failed (each answered by its limiter's on_store_error): none expected.
  store_errors=$(awk '/^fleet_limiter_decisions_total\{.*outcome="store_error_/ { s += $NF } END { print s + 0 }' <<<"$m")
  probe=$(python3 -c '
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    s = {}
st = s.get("statuses", {})
print(s.get("checks", 0), s.get("inexact", 0), s.get("max_drift", 0), s.get("errors", 0),
      sum(v for k, v in st.items() if k.startswith("5")))' "$TMP/probe.json")
  read -r pchecks pinexact pdrift perrors p5xx <<<"$probe"
  redis_kib=""
  if [ "$STORE" = redis ]; then
    redis_kib=$(redis-cli -p "$P_REDIS" info memory | awk -F: '/^used_memory:/ { printf "%d", $2 / 1024 }')
  fi
  echo "$t,$rss,$rps,$p50,$p99,$total,${s2xx:-0},${s429:-0},${s5xx:-0},${sother:-0},${sock:-0},$tracked,$evicted,$known_evicted,$pchecks,$pinexact,$pdrift,$perrors,$p5xx,$redis_kib,$store_errors" >>"$csv"
  log "t=${t}s rss=${rss}KiB rps=$rps p99=${p99}us 2xx=${s2xx:-0} 429=${s429:-0} 5xx=${s5xx:-0} tracked=$tracked evicted=$evicted store_errors=$store_errors probes=$pchecks inexact=$pinexact"
done

# The probes' last word, then the verdict.
kill -TERM "$PROBE_PID" 2>/dev/null || true
wait "$PROBE_PID" 2>/dev/null || true
read -r pchecks pinexact pdrift perrors p5xx < <(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
st = s.get("statuses", {})
print(s["checks"], s["inexact"], s["max_drift"], s["errors"], sum(v for k, v in st.items() if k.startswith("5")))' "$TMP/probe.json")
python3 - "$csv" "$pchecks" "$pinexact" "$pdrift" "$perrors" "$p5xx" <<'PY'
import csv, sys
path, *vals = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
for k, v in zip(["probe_checks", "probe_inexact", "probe_max_drift", "probe_errors", "probe_5xx"], vals):
    rows[-1][k] = v
with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)
PY
cp "$TMP/probe.json" "$OUT/probe.json"
printf 'finished: %s\n' "$(date -u +%FT%TZ)" >>"$OUT/command.txt"
set +e
python3 "$BENCH/soak_report.py" "$csv" "$WARMUP" "$RSS_TOLERANCE" "$P99_TOLERANCE" "$STORE" |
  tee "$OUT/summary.txt"
rc=${PIPESTATUS[0]}
set -e
log "samples: $csv; summary: $OUT/summary.txt"
exit "$rc"
