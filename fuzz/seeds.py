#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from the repository's own examples:
tests/paths/corpus.txt (hostile request targets), tests/replay/agent.format and the log lines
of the parsers' unit tests, docs/examples/*.toml. Run from anywhere: `python3 fuzz/seeds.py`.
Every seed is text without a NUL byte (the repository holds text only, .ci/no-binaries);
the fuzzer finds the bytes that need none of this on its own."""
import hashlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def write(target, data):
    if isinstance(data, str):
        data = data.encode()
    if b"\0" in data:
        return
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def targets():
    """The request targets of tests/paths/corpus.txt, `\\xHH` decoded."""
    with open(os.path.join(ROOT, "tests", "paths", "corpus.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            parts = line.split(" ", 1)
            if len(parts) != 2:
                continue
            target = parts[1].split(" => ")[0]
            raw = re.sub(rb"\\x([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), target.encode())
            yield parts[0], raw


# 1. Paths: the path of each target (its query dropped).
for _method, t in targets():
    write("path", t.split(b"?")[0])
    write("path", t)

# 2. The decision endpoint: each target asked as each proxy asks.
for i, (method, t) in enumerate(targets()):
    if i % 3 == 0:
        write("forward_auth", b"0a\nGET /envoy/\nX-Original-Method: " + method.encode() + b"\nX-Original-URI: " + t + b"\n")
    elif i % 3 == 1:
        write("forward_auth", b"1a\nGET /envoy/\nX-Forwarded-Method: " + method.encode() + b"\nX-Forwarded-Uri: " + t + b"\nX-Agent-ID: agent-1\n")
    else:
        write("forward_auth", b"2a\n" + method.encode() + b" /envoy" + t + b"\nAuthorization: Bearer x\n")
write("forward_auth", "0a\nGET /envoy/\nX-Original-Method: POST\nX-Original-URI: /api/tasks?_method=DELETE\nX-HTTP-Method-Override: PUT\n")
write("forward_auth", "1a\nGET /envoy/\nX-Forwarded-Method: GET\nX-Forwarded-Uri: /a\nX-Original-URI: /b\n")
write("forward_auth", "0a\nGET /envoy/\nX-Original-Method: GET\nX-Original-URI: /a\nX_Original_URL: /admin\n")

# 3. nginx: formats and lines.
COMBINED_LINES = [
    '203.0.113.10 - alice [10/Oct/2000:13:55:36 -0700] "GET /api/tasks?x=1 HTTP/1.1" 200 2326 "-" "curl/8 \\"q\\""',
    '1.2.3.4 - - [24/Nov/2026:10:00:01 +0000] "POST /api/agent/heartbeat HTTP/1.1" 200 1 "-" "fleet-agent/2.1"',
    '2001:db8::1 - - [24/Nov/2026:10:00:01.250 +01:00] "GET /api/agent/download/linux HTTP/2.0" 404 0 "-" "-"',
]
for line in COMBINED_LINES:
    write("nginx", "=\n" + line)
with open(os.path.join(ROOT, "tests", "replay", "agent.format"), encoding="utf-8") as f:
    agent = f.read().strip()
write("nginx", agent + "\n" + COMBINED_LINES[1] + ' "198.51.100.7, 10.0.0.1" "agent-7"')
write("nginx", '$remote_addr [$time_iso8601] "$request" $status "$http_x_forwarded_for" "$http_x_agent_id" auth=$http_authorization\n'
      '10.0.0.2 [2000-10-10T20:55:36Z] "POST /api/agent/heartbeat HTTP/1.1" 200 "198.51.100.7, 10.0.0.1" "agent-7" auth=Bearer x')
write("nginx", '${remote_addr}|$msec|$request_method|$request_uri|$remote_user\n10.0.0.2|971211336.125|GET|/api/tasks|bob')

# 4. ALB.
ALB = ('https 2026-11-24T10:00:01.186641Z app/fleet-api/50dc6c495c0c9188 {ip}:2817 10.0.0.1:80 0.000 0.001 0.000 200 200 34 366 '
       '"{m} https://api.example.com:443{p} HTTP/1.1" "fleet-agent/2.1" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 '
       'arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/t/73e2d6bc24d8a067 "Root=1-58337262-36d228ad5d99923122bbe354" '
       '"api.example.com" "-" 0 2026-11-24T10:00:01.180000Z "forward" "-" "-" "10.0.0.1:80" "200" "-" "-"')
for ip, m, p in [("203.0.113.7", "POST", "/api/agent/heartbeat?x=1"), ("[2001:db8::1]", "GET", "/api/tasks"),
                 ("2001:db8::2", "DELETE", "/api/a%20b")]:
    write("alb", ALB.format(ip=ip, m=m, p=p))

# 5. JSON lines.
write("json", '{"remote_addr":"203.0.113.7","time_iso8601":"2026-11-24T10:00:01+00:00","request":"POST /api/agent/heartbeat HTTP/1.1","status":200,"http_x_agent_id":"agent-1"}')
write("json", 'json:addr=client,time=ts,method=verb,uri=route,agent_id=agent\n{"client":"198.51.100.4","ts":1795996801.25,"verb":"GET","route":"/api\\/reports?x=1","agent":"-"}')
write("json", '{"ip":"::1","@timestamp":"24/Nov/2026:10:00:01 +0000","method":"GET","path":"/x","x-forwarded-for":"1.2.3.4","user":"u"}')

# 6. Header values.
for v in ["agent-7", "a.b_c:d-1", "Bearer eyJhbGciOiJIUzI1NiJ9.e30.x", "bearer  tok ", "42", " 7 ",
          "18446744073709551616", "0", "-1", "3.5", "198.51.100.7, 10.0.0.1", "for=192.0.2.60;proto=http;by=203.0.113.43",
          'for="[2001:db8:cafe::17]:4711"', "unknown, 10.0.0.2", "__session=abc; other=1", "[::ffff:10.0.0.1]:80"]:
    write("header_values", v)

# 7. Configuration: each example file, with and without secrets and variables.
ex = os.path.join(ROOT, "docs", "examples")
for i, name in enumerate(sorted(os.listdir(ex))):
    if name.endswith(".toml"):
        with open(os.path.join(ex, name), encoding="utf-8") as f:
            toml = f.read()
        write("config", chr(0x40 + i) + "pre\tpost\n" + toml)
write("config", "#\n[server]\nlisten = \"127.0.0.1:0\"\n%%\nFLEET_LIMITER_STORE_URL=redis://u:$S@127.0.0.1:6379/0?x=$S\n")
write("config", "!ab\tcd\n[identity]\njwt_hs256_secret = \"dup\"\n%%\nFLEET_LIMITER_JWT_HS256_SECRET=short$S\n")
write("config", "\"\n%%\nFLEET_LIMITER_STORE=redis://$S@h:1\nFLEET_LIMITER_UPSTREAM=http://a:$S@[::1\nFLEET_LIMITER_JWKS_URL=https://h/j#$S\n")
write("config", "0\n[limiters.api]\nroutes = [\"GET /api/*\"]\nlimit = 5\nwindow = \"1m\"\n%%\nFLEET_LIMITER_LIMITER_API_LIMIT=x\nFLEET_LIMITER_STORE_CLUSTER=redis://:$S@a:1,redis://b:2\n")

# 8. Body keys: JSON ("0" in front) and form ("1") bodies, plain and hostile.
for body in ['{"email":"victim@example.com","password":"x"}', '{"email":"decoy@x.test","email":"Victim@Example.COM"}',
             '{"email":["victim@example.com"]}', '{"email":"\\"victim\\"@b\\u00fccher.example"}',
             '{"email":"vic\\u200btim\\uff20example.com"}', '{"email":"a@x,b@y"}', '{"n":[[[[1]]]],"email":42}',
             '\ufeff{"email":"bom@example.com"}']:
    write("body_keys", "0" + body)
for body in ["email=victim%40example.com&password=x", "email=a&email=b", "email[]=victim%40example.com",
             "email=+Victim%2Btag%40Example.COM.+&n=%zz", "x=1&&email=%E2%80%8Bv%40x.io"]:
    write("body_keys", "1" + body)

# 9. Upstream answers for the proxy's client against hyper's: a method byte ("0" GET, "1" HEAD),
# then the raw answer (the misframings of src/http/proxy/differential.rs SEEDS).
ANSWERS = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello worldHTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-Injected: 1\r\n\r\ninjected",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-L: a\nSet-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-L: a\rSet-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\ninjected",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\nabc",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-Up: close\r\n\r\nuntil the connection closes",
    b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nnew",
    b"HTTP/1.1 200 OK\r\nConnection: X-Named\r\nX-Named: 1\r\nKeep-Alive: timeout=5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-Up: fold\r\n  ed\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nraw",
    b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX\xd2T: 1\r\n\r\n200 OK",
    b"HTTP/1.1 200 OKb\r\nTransfer-Encoding: gzi\xa5, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
]
for a in ANSWERS:
    write("proxy_answers", b"0" + a)
    write("proxy_answers", b"1" + a)
