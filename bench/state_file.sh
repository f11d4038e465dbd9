#!/usr/bin/env bash
# store.state_file at scale: the time to write and read back a million buckets, and the file's
# size, measured on the release binary through its own log lines.
#
#   bench/state_file.sh                 # 1 000 000 buckets
#   BUCKETS=100000 bench/state_file.sh
#
# A file of BUCKETS GCRA buckets (each 10 minutes from full, within key-rotation's 15-minute
# window) is written by bench/state_file.py in the format src/store/state_file.rs reads; the
# gateway starts on it with store.max_keys = BUCKETS and logs how long reading and restoring
# took; SIGTERM makes it write them all back, logging how long that took.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUCKETS=${BUCKETS:-1000000}
TMP=$(mktemp -d)
trap 'kill "${GW:-}" 2>/dev/null || true; rm -rf "$TMP"' EXIT

cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
BIN="$ROOT/target/release/fleet-limiter"
python3 "$ROOT/bench/state_file.py" "$TMP/state" "$BUCKETS"
size=$(stat -c %s "$TMP/state")

FLEET_LIMITER_STORE_STATE_FILE="$TMP/state" FLEET_LIMITER_MAX_KEYS="$BUCKETS" \
  FLEET_LIMITER_LOG_FORMAT=json FLEET_LIMITER_ADMIN_LISTEN=127.0.0.1:0 \
  "$BIN" serve --listen 127.0.0.1:0 --upstream http://127.0.0.1:9 >"$TMP/log" 2>&1 &
GW=$!
for _ in $(seq 1 600); do
  grep -q '"gateway started\|fleet-limiter gateway started' "$TMP/log" && break
  sleep 0.1
done
rss=$(awk '/VmRSS/ {print $2}' "/proc/$GW/status")
kill -TERM "$GW"
wait "$GW" || true
GW=

python3 - "$TMP/log" "$BUCKETS" "$size" "$rss" <<'PY'
import json, sys
log, buckets, size, rss = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
read_ms = write_ms = restored = written = None
for line in open(log):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    msg = e.get("message", "")
    if "read and restored" in msg:
        read_ms = e.get("milliseconds")
    if "buckets restored" in msg:
        restored = e.get("buckets")
    if "buckets written" in msg:
        write_ms, written = e.get("milliseconds"), e.get("buckets")
print(f"buckets in the file: {buckets}; restored: {restored}; written back: {written}")
print(f"file size: {size} bytes ({size / buckets:.1f} bytes a bucket)")
print(f"read and restore at start: {read_ms:.0f} ms")
print(f"write at stop (fsync and rename included): {write_ms:.0f} ms")
print(f"resident memory after the restore: {rss / 1024:.0f} MiB")
PY
