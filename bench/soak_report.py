#!/usr/bin/env python3
"""Summarise bench/soak.sh's CSV and judge it.

    soak_report.py CSV WARMUP_S RSS_TOLERANCE P99_TOLERANCE STORE

The samples taken in the first WARMUP_S seconds (the store filling up to its cap, the
allocator settling) are left out. Of the rest, "first" is the median of the first three
samples and "last" the median of the last three (one noisy interval on a shared machine moves
neither). It fails (exit status 1) when

- the last RSS is above RSS_TOLERANCE times the first (1.25: more than 25 % growth),
- the last p99 is above P99_TOLERANCE times the first,
- any probe answer was off its exact count (an inexact tracked bucket),
- any answer of the load or of the probes was a 5xx, or the probes got no answer at all,
- any request of the load failed at the socket (wrk's socket errors) or any probe request got
  no answer or an answer without its limit headers (the probes' errors),
- the store failed any decision (`store_errors`: each was answered by its limiter's
  `on_store_error`, allowed by default, which a soak must not need; samples written before the
  column existed are not judged on it),
- memory store: it evicted nothing after the warm-up (the soak did not run at the cap);
- Redis store: Redis's `used_memory` grew beyond RSS_TOLERANCE too (its buckets expire when
  full again, as fast as the load makes new ones, so it must stay flat).

Prints the summary, with the run after the warm-up cut into (at most) eight equal spans and
each span's median RSS, p99 and requests per second, so a trend shows that first-versus-last
would hide; the same text is what bench/soak.sh writes to summary.txt.
"""

import csv
import statistics
import sys


def main():
    path, warmup, rss_tol, p99_tol = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    store = sys.argv[5]
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print("no samples")
        return 1
    steady = [r for r in rows if float(r["t_s"]) >= warmup]
    if len(steady) < 6:
        print(f"too few samples after the {warmup:.0f} s warm-up ({len(steady)}): run longer")
        return 1

    def med(rs, col):
        return statistics.median(float(r[col]) for r in rs)

    head, tail = steady[:3], steady[-3:]
    rss0, rss1 = med(head, "rss_kib"), med(tail, "rss_kib")
    p990, p991 = med(head, "p99_us"), med(tail, "p99_us")
    last = rows[-1]
    total = lambda col: sum(int(float(r[col])) for r in rows)  # noqa: E731
    requests, ok, refused = total("requests"), total("s2xx"), total("s429")
    s5xx, other, sock = total("s5xx"), total("sother"), total("socket_errors")
    evicted = float(last["evicted_keys"]) - float(steady[0]["evicted_keys"])
    probe_checks, probe_inexact = int(last["probe_checks"]), int(last["probe_inexact"])
    probe_drift, probe_errors = int(last["probe_max_drift"]), int(last["probe_errors"])
    probe_5xx = int(last["probe_5xx"])
    span = float(rows[-1]["t_s"])
    rss_peak = max(float(r["rss_kib"]) for r in steady)
    store_errors = None
    if "store_errors" in last and last["store_errors"] not in (None, ""):
        store_errors = int(float(last["store_errors"]))
    rps = statistics.median(float(r["rps"]) for r in steady)

    failures = []
    if rss1 > rss0 * rss_tol:
        failures.append(f"RSS grew {rss1 / rss0:.2f}x (tolerance {rss_tol}x)")
    if p991 > p990 * p99_tol:
        failures.append(f"p99 grew {p991 / p990:.2f}x (tolerance {p99_tol}x)")
    if probe_inexact or probe_checks == 0:
        failures.append(
            f"{probe_inexact} of {probe_checks} probe answers inexact (max drift {probe_drift})"
        )
    if s5xx or probe_5xx:
        failures.append(f"5xx answers: {s5xx} to the load, {probe_5xx} to the probes")
    if sock:
        failures.append(f"{sock} socket errors of the load")
    if probe_errors:
        failures.append(f"{probe_errors} probe requests without an answer or its limit headers")
    if store_errors:
        failures.append(f"the store failed {store_errors} decisions")
    if store == "memory" and evicted <= 0:
        failures.append("nothing was evicted after the warm-up: not at the cap")

    lines = [
        f"samples: {len(rows)} over {span:.0f} s ({len(steady)} after the {warmup:.0f} s warm-up)",
        f"load: {requests} requests, median {rps:.0f}/s; 2xx {ok}, 429 {refused}, 5xx {s5xx}, "
        f"other {other}, socket errors {sock}",
        f"store: {last['tracked_keys']} keys tracked at the end, {evicted:.0f} evicted after the warm-up"
        if store == "memory"
        else f"store: {last['tracked_keys']} keys in Redis at the end (each expires when full again)",
        f"memory (RSS): first {rss0 / 1024:.1f} MiB, last {rss1 / 1024:.1f} MiB ({rss1 / rss0:.3f}x; "
        f"tolerance {rss_tol}x), peak {rss_peak / 1024:.1f} MiB",
        "store errors: "
        + ("not sampled" if store_errors is None else f"{store_errors} decisions failed by the store"),
        f"p99 latency: first {p990 / 1000:.2f} ms, last {p991 / 1000:.2f} ms ({p991 / p990:.2f}x; "
        f"tolerance {p99_tol}x)",
        f"probes: {probe_checks} answers checked, {probe_inexact} inexact, max drift {probe_drift}, "
        f"{probe_errors} errors ({probe_5xx} 5xx)",
    ]
    if store == "redis":
        r0, r1 = med(head, "redis_used_kib"), med(tail, "redis_used_kib")
        lines.append(
            f"redis used_memory: first {r0 / 1024:.1f} MiB, last {r1 / 1024:.1f} MiB "
            f"({r1 / r0:.3f}x; tolerance {rss_tol}x)"
        )
        if r1 > r0 * rss_tol:
            failures.append(f"Redis used_memory grew {r1 / r0:.2f}x (tolerance {rss_tol}x)")
    lines.append("by span (medians): from s, to s, RSS MiB, p99 ms, requests/s")
    spans = min(8, len(steady) // 3)
    for i in range(spans):
        part = steady[i * len(steady) // spans : (i + 1) * len(steady) // spans]
        lines.append(
            f"  {float(part[0]['t_s']):.0f}-{float(part[-1]['t_s']):.0f}: "
            f"{med(part, 'rss_kib') / 1024:.1f}, {med(part, 'p99_us') / 1000:.2f}, "
            f"{med(part, 'rps'):.0f}"
        )
    lines.append("verdict: " + ("FAIL: " + "; ".join(failures) if failures else "pass"))
    print("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
