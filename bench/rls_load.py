#!/usr/bin/env python3
"""Decisions per second: Envoy's rate-limit service over gRPC beside the decision endpoint.

Starts one fleet-limiter with both listeners (no upstream) on one limiter, `bench`, keyed on the
client address (a budget nothing exhausts), and asks each in turn, rounds interleaved:

  rls       ShouldRateLimit, one descriptor (remote_address, <address>) whose YAML rule is
            `fleet_limiter: bench`, through envoy's generated client (PyPI xds-protos, grpcio)
  decision  GET /caddy with X-Forwarded-Method/-Uri and X-Forwarded-For: <address>, over
            keep-alive HTTP/1.1 (http.client)

Each kind is asked by CLIENTS processes, each one request at a time, rotating over 1 000
addresses; both spend the same buckets. The load is Python: on a small machine the clients
are busier than the server (grpcio's Python stub above all), so decisions per second mostly
measure the clients; the server's CPU time per decision (from /proc, over each measured
phase) is the figure that measures the server. Compare the two kinds with each other, not
with bench/run.sh's wrk figures. Every answer is checked (OK / 200); a wrong one fails the run.

  python3 bench/rls_load.py                        # target/release/fleet-limiter, memory store
  python3 bench/rls_load.py --rounds 5 --duration 5 --clients 4
  python3 bench/rls_load.py --store redis://127.0.0.1:6379
"""
import argparse
import http.client
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

TOML = """[client_ip]
trust_proxy = ["127.0.0.1"]
[decision]
allow_from = ["127.0.0.1"]
[rls]
allow_from = ["127.0.0.1"]
[limiters.bench]
limit = 100000000
window = "1m"
key = "ip"
routes = ["/api/**"]
"""

YAML = """domain: bench
descriptors:
  - key: remote_address
    fleet_limiter: bench
"""

ADDRESSES = [f"10.{i // 250}.{i % 250}.1" for i in range(1000)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rls_worker(addr, deadline, out):
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

    requests = [
        rls_pb2.RateLimitRequest(
            domain="bench",
            descriptors=[ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="remote_address", value=a)])],
        )
        for a in ADDRESSES
    ]
    ok_code = rls_pb2.RateLimitResponse.OK
    n = bad = 0
    with grpc.insecure_channel(addr) as ch:
        stub = rls_pb2_grpc.RateLimitServiceStub(ch)
        while time.monotonic() < deadline:
            r = stub.ShouldRateLimit(requests[n % len(requests)], timeout=10)
            if r.overall_code != ok_code:
                bad += 1
            n += 1
    out.put((n, bad))


def decision_worker(addr, deadline, out):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    n = bad = 0
    while time.monotonic() < deadline:
        conn.request("GET", "/caddy", headers={
            "X-Forwarded-Method": "GET",
            "X-Forwarded-Uri": "/api/x",
            "X-Forwarded-For": ADDRESSES[n % len(ADDRESSES)],
        })
        res = conn.getresponse()
        res.read()
        if res.status != 200:
            bad += 1
        n += 1
    conn.close()
    out.put((n, bad))


def cpu_seconds(pid):
    """The server's CPU time so far (user + system), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(worker, addr, clients, duration, warmup, pid):
    """Decisions per second of `clients` processes over `duration` seconds (after `warmup`),
    and the server's CPU microseconds per decision."""
    out = mp.Queue()
    start = time.monotonic() + warmup
    deadline = start + duration
    # Warm-up: the same workers, uncounted.
    procs = [mp.Process(target=worker, args=(addr, start, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:
        out.get()
    for p in procs:
        p.join()
    procs = [mp.Process(target=worker, args=(addr, time.monotonic() + duration, out))
             for _ in range(clients)]
    began = time.monotonic()
    cpu = cpu_seconds(pid)
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    elapsed = time.monotonic() - began
    cpu = cpu_seconds(pid) - cpu
    for p in procs:
        p.join()
    n = sum(r[0] for r in results)
    bad = sum(r[1] for r in results)
    if bad:
        sys.exit(f"{bad} of {n} answers were not OK/200: is a budget exhausted?")
    del deadline
    return n / elapsed, cpu * 1e6 / max(n, 1)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(root, "target/release/fleet-limiter"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--store", default="memory")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="fleet-limiter-bench-rls.")
    with open(os.path.join(tmp, "c.toml"), "w") as f:
        f.write(TOML)
    with open(os.path.join(tmp, "rl.yaml"), "w") as f:
        f.write(YAML)
    rls = f"127.0.0.1:{free_port()}"
    decision = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_LIMITER_")}
    env["FLEET_LIMITER_LOG"] = "warn"
    server = subprocess.Popen(
        [args.binary, "serve", "--config", os.path.join(tmp, "c.toml"), "--allow-unsafe-calibration",
         "--store", args.store, "--decision-listen", decision, "--rls-listen", rls,
         "--rls-config", os.path.join(tmp, "rl.yaml"), "--admin-listen", f"127.0.0.1:{free_port()}"],
        env=env, stderr=open(os.path.join(tmp, "stderr.log"), "w"))
    try:
        for _ in range(200):
            try:
                socket.create_connection(tuple(decision.rsplit(":", 1)), timeout=0.2).close()
                socket.create_connection(tuple(rls.rsplit(":", 1)), timeout=0.2).close()
                break
            except OSError:
                if server.poll() is not None:
                    sys.exit(open(os.path.join(tmp, "stderr.log")).read())
                time.sleep(0.05)
        rows = {"rls": [], "decision": []}
        cpu = {"rls": [], "decision": []}
        for r in range(args.rounds):
            order = [("rls", rls_worker, rls), ("decision", decision_worker, decision)]
            if r % 2:
                order.reverse()
            for name, worker, addr in order:
                rate, us = load(worker, addr, args.clients, args.duration, args.warmup, server.pid)
                rows[name].append(rate)
                cpu[name].append(us)
        summary = {k: round(statistics.median(v)) for k, v in rows.items()}
        summary["server_cpu_us_per_decision"] = {
            k: round(statistics.median(v), 1) for k, v in cpu.items()}
        summary["ratio_rls_to_decision"] = round(
            statistics.median(a / b for a, b in zip(rows["rls"], rows["decision"])), 2)
        summary["rounds"] = {k: [round(x) for x in v] for k, v in rows.items()}
        summary["clients"] = args.clients
        summary["duration_s"] = args.duration
        summary["store"] = args.store
        print(json.dumps(summary, indent=2))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
