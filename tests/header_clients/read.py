"""Asks URL COUNT times as agent AGENT and prints one JSON line per answer: its status, its
headers, what the PyPI package ratelimit-headers read from it (the reset in milliseconds since
the epoch, and the format it detected) and when it was read.

    python3 read.py URL AGENT COUNT
"""

import json
import sys
import time
import urllib.error
import urllib.request

import ratelimit_headers

url, agent, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
# No proxy from the environment: the gateway is on loopback.
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for _ in range(count):
    req = urllib.request.Request(url, headers={"X-Agent-ID": agent})
    try:
        with opener.open(req) as res:
            status, headers = res.status, dict(res.headers.items())
            res.read()
    except urllib.error.HTTPError as e:
        status, headers = e.code, dict(e.headers.items())
        e.read()
    state = ratelimit_headers.parse(response_headers=headers)
    now = time.time() * 1000
    print(
        json.dumps(
            {
                "status": status,
                "headers": {k.lower(): v for k, v in headers.items()},
                "now": now,
                "parsed": {
                    "limit": state.limit,
                    "remaining": state.remaining,
                    "reset": state.reset.timestamp() * 1000 if state.reset else None,
                    "source": state.source,
                },
            }
        ),
        flush=True,
    )
