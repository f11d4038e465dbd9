"""One GET of URL as agent AGENT through urllib3 with Retry(respect_retry_after_header=True):
one retry allowed, after the wait Retry-After asks for. Prints the final status and the
statuses it retried on; exits non-zero when the retry was refused too.

    python3 retry.py URL AGENT
"""

import json
import sys

import urllib3
from urllib3.util.retry import Retry

url, agent = sys.argv[1], sys.argv[2]
retry = Retry(
    total=1,
    status_forcelist=[429],
    respect_retry_after_header=True,
    raise_on_status=True,
    backoff_factor=0,
)
http = urllib3.PoolManager(retries=retry)
res = http.request("GET", url, headers={"X-Agent-ID": agent})
print(
    json.dumps(
        {
            "status": res.status,
            "retried_on": [h.status for h in res.retries.history],
        }
    )
)
