#!/usr/bin/env python3
"""The small hosts tests/netns.rs runs inside its network namespaces.

upstream ADDR PORT
    An HTTP/1.1 API: `GET /stream?chunks=N&size=BYTES&every_ms=MS` answers 200 with a
    Content-Length of N*BYTES and sends it in N pieces, one every MS milliseconds (a large
    streaming download); anything else answers 200 "ok".

relay LISTEN_ADDR LISTEN_PORT TARGET_ADDR TARGET_PORT CONTROL_FILE
    A TCP relay in front of a server, for what the kernel here cannot do (no `netem`): every
    piece of data it carries, in either direction, is held `delay_ms` milliseconds (a one-way
    delay, order kept), and with probability `loss` held `loss_ms` more, which is what a lost
    segment costs a TCP stream (the retransmission; later data waits behind it). The settings
    are read from CONTROL_FILE, a JSON object `{"delay_ms": 0, "loss": 0.0, "loss_ms": 0}`,
    whenever it changes; a missing or unreadable file means no delay and no loss.

Each prints `ready` on stdout once it listens.
"""

import asyncio
import json
import os
import random
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/stream":
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            chunks = int(q.get("chunks", "100"))
            size = int(q.get("size", "65536"))
            every = int(q.get("every_ms", "20")) / 1000.0
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(chunks * size))
            self.end_headers()
            piece = b"x" * size
            try:
                for _ in range(chunks):
                    self.wfile.write(piece)
                    self.wfile.flush()
                    time.sleep(every)
            except OSError:
                self.close_connection = True
            return
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


def upstream(addr, port):
    server = ThreadingHTTPServer((addr, int(port)), Upstream)
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()


class Faults:
    """The relay's settings, read again from the control file when it changes."""

    def __init__(self, path):
        self.path = path
        self.mtime = None
        self.delay = 0.0
        self.loss = 0.0
        self.loss_hold = 0.0

    def refresh(self):
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            self.delay, self.loss, self.loss_hold, self.mtime = 0.0, 0.0, 0.0, None
            return
        if mtime == self.mtime:
            return
        try:
            with open(self.path) as f:
                s = json.load(f)
        except (OSError, ValueError):
            return
        self.mtime = mtime
        self.delay = float(s.get("delay_ms", 0)) / 1000.0
        self.loss = float(s.get("loss", 0.0))
        self.loss_hold = float(s.get("loss_ms", 0)) / 1000.0

    def hold(self):
        extra = self.loss_hold if self.loss > 0 and random.random() < self.loss else 0.0
        return self.delay + extra


async def pipe(reader, writer, faults):
    """Carry one direction, each piece released at its time, never before an earlier one."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def release():
        while True:
            item = await queue.get()
            if item is None:
                break
            at, data = item
            wait = at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            try:
                await writer.drain()
            except OSError:
                break
        try:
            writer.close()
        except OSError:
            pass

    sender = asyncio.ensure_future(release())
    last = 0.0
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            faults.refresh()
            last = max(loop.time() + faults.hold(), last)
            queue.put_nowait((last, data))
    except OSError:
        pass
    queue.put_nowait(None)
    await sender


async def relay(listen_addr, listen_port, target_addr, target_port, control):
    async def serve(client_reader, client_writer):
        faults = Faults(control)
        faults.refresh()
        try:
            server_reader, server_writer = await asyncio.open_connection(
                target_addr, int(target_port)
            )
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            pipe(client_reader, server_writer, faults),
            pipe(server_reader, client_writer, faults),
        )

    server = await asyncio.start_server(serve, listen_addr, int(listen_port))
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "upstream":
        upstream(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 7 and sys.argv[1] == "relay":
        asyncio.run(relay(*sys.argv[2:7]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
