#!/usr/bin/env python3
"""bench/soak.sh's probe: a few principals whose buckets must stay exact under the soak's load.

    soak_probe.py HOST PORT PROBES RATE LIMIT RUN STATE_FILE

PROBES agents (`X-Agent-ID: probe-<RUN>-<i>`) each send `GET /probe/x` RATE times a second,
one at a time, on a kept-alive connection. The soak's `soak-probe` limiter meters them on a
fixed window of LIMIT requests a week: nothing refills during the soak, so after the k-th
request the answer's `X-RateLimit-Remaining` must be exactly LIMIT - k. A bucket the store
dropped (evicted) would start again full and answer more than that.

A probe request that gets no answer may or may not have been counted; the next answer is then
accepted anywhere in the range the lost ones allow, and the count follows it.

Every second (and when stopped by SIGTERM or SIGINT) STATE_FILE is replaced with the totals:
`checks` (answers compared), `inexact` (answers off the expected count), `max_drift` (the
largest difference seen), `errors` (no answer, or a status other than 200), `statuses`
(the count of each status seen), `last` (each probe's last remaining).
"""

import http.client
import json
import os
import signal
import sys
import threading
import time


def main():
    host, port, probes, rate, limit, run, state_file = sys.argv[1:8]
    port, probes, rate, limit = int(port), int(probes), float(rate), int(limit)
    lock = threading.Lock()
    totals = {"checks": 0, "inexact": 0, "max_drift": 0, "errors": 0, "statuses": {}, "last": {}}
    stop = threading.Event()

    def write_state():
        with lock:
            text = json.dumps(totals)
        tmp = state_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, state_file)

    def probe(i):
        agent = f"probe-{run}-{i}"
        sent = 0  # requests answered (so certainly counted)
        unsure = 0  # requests without an answer since the last one (counted or not)
        conn = None
        period = 1.0 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            next_at += period
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, port, timeout=30)
                conn.request("GET", "/probe/x", headers={"X-Agent-ID": agent})
                res = conn.getresponse()
                res.read()
                status = res.status
                remaining = res.getheader("X-RateLimit-Remaining")
                which = res.getheader("X-RateLimit-Limit")
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
                unsure += 1
                with lock:
                    totals["errors"] += 1
                    totals["statuses"]["none"] = totals["statuses"].get("none", 0) + 1
                status = None
            if status is not None:
                with lock:
                    key = str(status)
                    totals["statuses"][key] = totals["statuses"].get(key, 0) + 1
                if status != 200 or remaining is None or which != str(limit):
                    with lock:
                        totals["errors"] += 1
                    unsure += 1
                else:
                    got = int(remaining)
                    # This request was counted; of the unsure ones, any number may have been.
                    high = limit - (sent + 1)
                    low = high - unsure
                    drift = 0 if low <= got <= high else min(abs(got - low), abs(got - high))
                    with lock:
                        totals["checks"] += 1
                        totals["last"][agent] = got
                        if drift:
                            totals["inexact"] += 1
                            totals["max_drift"] = max(totals["max_drift"], drift)
                    sent = limit - got if drift == 0 else sent + 1
                    unsure = 0
            wait = next_at - time.monotonic()
            if wait > 0:
                stop.wait(wait)
            else:
                next_at = time.monotonic()

    def finish(*_):
        stop.set()

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    workers = [threading.Thread(target=probe, args=(i,), daemon=True) for i in range(probes)]
    for w in workers:
        w.start()
    while not stop.is_set():
        write_state()
        stop.wait(1.0)
    for w in workers:
        w.join(timeout=35)
    write_state()


if __name__ == "__main__":
    main()
