"""Turn bench/run.sh results (round, path, config, rps, p50, p99, non2xx, total) into one
markdown table of medians and ratios, then the targets as ratios paired within each round."""
import statistics
import sys
from collections import defaultdict

NAMES = {
    "upstream": "1. upstream alone (nginx `return 200`)",
    "gateway-on": "2. fleet-limiter gateway, limiter on, memory store",
    "gateway-off": "3. fleet-limiter gateway, limiter off",
    "gateway-redis": "4. fleet-limiter gateway, Redis store (Redis on the server core)",
    "gateway-redis-apart": "4b. fleet-limiter gateway, Redis store (Redis on the load core)",
    "nginx-limit": "5. nginx `limit_req` reverse proxy",
    "mw-fleet": "6a. actix-web + FleetLimiter middleware",
    "mw-governor": "6b. actix-web + actix-governor (ip+agent)",
    "mw-bare": "6c. actix-web bare",
    "express-memory": "7a. express + express-rate-limit v8 (MemoryStore)",
    "express-redis": "7b. express + express-rate-limit v8 + rate-limit-redis",
}
ORDER = list(NAMES)
CONNS = sys.argv[3] if len(sys.argv) > 3 else "32"
LAT_CONNS = sys.argv[4] if len(sys.argv) > 4 else "1"

rows = defaultdict(list)  # (path, cfg) -> [(round, rps, p50, p99, non2xx, total)]
with open(sys.argv[1]) as f:
    for line in f:
        parts = line.rstrip("\n").split("\t")
        if len(parts) < 8:
            continue
        rnd, path, cfg = parts[:3]
        rps, p50, p99 = (float(x) for x in parts[3:6])
        non2xx, total = int(parts[6]), int(parts[7])
        rows[(path, cfg)].append((int(rnd), rps, p50, p99, non2xx, total))
skipped = {}
if len(sys.argv) > 2:
    try:
        with open(sys.argv[2]) as f:
            for line in f:
                if "\t" in line:
                    cfg, why = line.rstrip("\n").split("\t", 1)
                    skipped[cfg] = why
    except FileNotFoundError:
        pass


def med(path, cfg, i):
    v = [r[i] for r in rows.get((path, cfg), [])]
    return statistics.median(v) if v else None


def paired(path_a, a, path_b, b, i=1):
    """Median over rounds of (a / b), each pair measured in the same round."""
    ra = {r[0]: r[i] for r in rows.get((path_a, a), [])}
    rb = {r[0]: r[i] for r in rows.get((path_b, b), [])}
    vals = [ra[k] / rb[k] for k in ra if k in rb and rb[k]]
    return statistics.median(vals) if vals else None


def paired_diff(path, a, b, i):
    ra = {r[0]: r[i] for r in rows.get((path, a), [])}
    rb = {r[0]: r[i] for r in rows.get((path, b), [])}
    vals = [ra[k] - rb[k] for k in ra if k in rb]
    return statistics.median(vals) if vals else None


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


n_rounds = max((r[0] for v in rows.values() for r in v), default=0)
up = med("allowed", "upstream", 1)
print(f"| configuration | allowed req/s (median of {n_rounds}) | x upstream | p50 µs | p99 µs | refusal-path req/s | refused share | refusal / allowed |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for cfg in ORDER:
    if (("allowed", cfg) not in rows) and cfg not in skipped:
        continue
    if cfg in skipped and ("allowed", cfg) not in rows:
        print(f"| {NAMES[cfg]} | skipped: {skipped[cfg].strip()} | | | | | | |")
        continue
    rps = med("allowed", cfg, 1)
    ref = med("refused", cfg, 1)
    share = None
    if ("refused", cfg) in rows:
        share = statistics.median(r[4] / r[5] for r in rows[("refused", cfg)] if r[5])
    print(
        f"| {NAMES[cfg]} | {fmt(rps, ',.0f')} | {fmt(rps / up if rps and up else None, '.2f')} | "
        f"{fmt(med('allowed', cfg, 2), '.0f')} | {fmt(med('allowed', cfg, 3), '.0f')} | "
        f"{fmt(ref, ',.0f')} | {fmt(share * 100 if share is not None else None, '.1f')}{'%' if share is not None else ''} | "
        f"{fmt(paired('refused', cfg, 'allowed', cfg), '.2f')} |"
    )

if any(path == "latency" for path, _ in rows):
    print()
    print(f"Latency at {LAT_CONNS} connection (no queueing), medians of {n_rounds} rounds:")
    print()
    print("| configuration | req/s | p50 µs | p99 µs | p50 added to upstream alone | p99 added to upstream alone |")
    print("|---|---:|---:|---:|---:|---:|")
    for cfg in ORDER:
        if ("latency", cfg) not in rows:
            continue
        print(
            f"| {NAMES[cfg]} | {fmt(med('latency', cfg, 1), ',.0f')} | {fmt(med('latency', cfg, 2), '.0f')} | "
            f"{fmt(med('latency', cfg, 3), '.0f')} | {fmt(paired_diff('latency', cfg, 'upstream', 2), '.0f')} | "
            f"{fmt(paired_diff('latency', cfg, 'upstream', 3), '.0f')} |"
        )

print()
print("| target | measured (median of per-round ratios) | goal | met |")
print("|---|---:|---:|---|")


def target(label, value, goal, ok, spec=".2f", unit="x"):
    met = "n/a" if value is None else ("yes" if ok(value) else "**no**")
    print(f"| {label} | {fmt(value, spec)}{unit if value is not None else ''} | {goal} | {met} |")


target("gateway: limiter on / off throughput", paired("allowed", "gateway-on", "allowed", "gateway-off"), ">= 0.95x", lambda v: v >= 0.95)
target(f"gateway: p99 added by the limiter (on - off), {LAT_CONNS} connection", paired_diff("latency", "gateway-on", "gateway-off", 3), "< 50 µs", lambda v: v < 50, ".0f", " µs")
target(f"gateway: p99 added by the limiter (on - off), {CONNS} connections (queueing included)", paired_diff("allowed", "gateway-on", "gateway-off", 3), "< 50 µs", lambda v: v < 50, ".0f", " µs")
target("middleware: FleetLimiter / actix-governor", paired("allowed", "mw-fleet", "allowed", "mw-governor"), ">= 1.0x", lambda v: v >= 1.0)
target("middleware: FleetLimiter / express + express-rate-limit", paired("allowed", "mw-fleet", "allowed", "express-memory"), ">= 5x", lambda v: v >= 5)
target("gateway / nginx limit_req", paired("allowed", "gateway-on", "allowed", "nginx-limit"), ">= 0.8x", lambda v: v >= 0.8)
target(f"Redis store / memory store (gateway, {CONNS} connections), Redis on the server core", paired("allowed", "gateway-redis", "allowed", "gateway-on"), ">= 0.6x", lambda v: v >= 0.6)
target(f"Redis store / memory store (gateway, {CONNS} connections), Redis on the load core", paired("allowed", "gateway-redis-apart", "allowed", "gateway-on"), ">= 0.6x", lambda v: v >= 0.6)
target("refusal path / allowed path (gateway, memory)", paired("refused", "gateway-on", "allowed", "gateway-on"), "> 1x", lambda v: v > 1)
target("refusal path / allowed path (middleware)", paired("refused", "mw-fleet", "allowed", "mw-fleet"), "> 1x", lambda v: v > 1)
