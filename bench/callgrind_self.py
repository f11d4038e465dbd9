#!/usr/bin/env python3
"""Per-function self cost per request from callgrind dumps, and the difference between two.

    callgrind_self.py DUMP REQUESTS [TOP]                  # one dump
    callgrind_self.py DUMP_A REQUESTS_A DUMP_B REQUESTS_B [TOP]   # A - B, largest first

The single-dump listing also gives what `memset` costs per request (`of which memset`).
Self cost is what a function's own instructions cost, callees excluded (inlined code counts
in the function it was inlined into). Used by bench/callgrind.sh.
"""

import collections
import re
import sys

NAME = re.compile(r"c?fn=\((\d+)\)(?: (.*))?")


def self_costs(path):
    names = {}
    costs = collections.Counter()
    fn = None
    after_calls = False
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith(("fn=", "cfn=")):
                m = NAME.match(line)
                if m and m.group(2):
                    names[m.group(1)] = m.group(2)
                if line.startswith("fn="):
                    fn = names.get(m.group(1), m.group(1)) if m else line[3:]
                continue
            if line.startswith("calls="):
                # The next cost line is the call's inclusive cost, not the caller's own.
                after_calls = True
                continue
            if line and (line[0].isdigit() or line[0] in "+-*"):
                parts = line.split()
                if len(parts) >= 2:
                    if after_calls:
                        after_calls = False
                    else:
                        costs[fn] += int(parts[1])
    return costs


def memset(costs):
    """What `memset` costs: a large one is a `rep stosb`, which callgrind counts byte by byte
    (actix-http zeroes a ~3 KiB header table on every pass of its request decoder)."""
    return sum(c for name, c in costs.items() if name and "memset" in name)


def main(argv):
    if len(argv) in (3, 4):
        costs, n = self_costs(argv[1]), int(argv[2])
        top = int(argv[3]) if len(argv) == 4 else 30
        print(f"{'per request':>12}  function (self cost)")
        print(f"{sum(costs.values()) / n:12.0f}  all")
        print(f"{memset(costs) / n:12.0f}  of which memset")
        for name, c in costs.most_common(top):
            print(f"{c / n:12.0f}  {name[:160]}")
        return 0
    if len(argv) in (5, 6):
        a, na = self_costs(argv[1]), int(argv[2])
        b, nb = self_costs(argv[3]), int(argv[4])
        top = int(argv[5]) if len(argv) == 6 else 30
        rows = sorted(set(a) | set(b), key=lambda k: -(a[k] / na - b[k] / nb))
        print(f"{'A - B':>8} {'A':>8} {'B':>8}  function (self cost per request)")
        total_a, total_b = sum(a.values()) / na, sum(b.values()) / nb
        print(f"{total_a - total_b:8.0f} {total_a:8.0f} {total_b:8.0f}  all")
        for k in rows[:top]:
            print(f"{a[k] / na - b[k] / nb:8.0f} {a[k] / na:8.0f} {b[k] / nb:8.0f}  {k[:160]}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
