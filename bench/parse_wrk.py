"""Read wrk --latency output on stdin; print `rps p50_us p99_us non2xx total` (tab-separated)."""
import re
import sys


def micros(v: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", v)
    if not m:
        return float("nan")
    n, unit = float(m.group(1)), m.group(2)
    return n * {"us": 1, "ms": 1e3, "s": 1e6, "m": 60e6}[unit]


text = sys.stdin.read()
rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
p50 = re.search(r"^\s+50%\s+(\S+)", text, re.M)
p99 = re.search(r"^\s+99%\s+(\S+)", text, re.M)
total = re.search(r"(\d+) requests in", text)
non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
errors = re.search(r"Socket errors:.*", text)
print(
    "\t".join(
        [
            rps.group(1) if rps else "nan",
            f"{micros(p50.group(1)):.0f}" if p50 else "nan",
            f"{micros(p99.group(1)):.0f}" if p99 else "nan",
            non2xx.group(1) if non2xx else "0",
            total.group(1) if total else "0",
        ]
    )
)
if errors:
    print(errors.group(0), file=sys.stderr)
