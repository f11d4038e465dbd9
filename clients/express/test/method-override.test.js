'use strict';
// The client in an Express 5 app that honours method overrides with the stock `method-override`
// middleware: the limiter meters the method Express routes on as well as the request's own,
// whichever of the two middlewares runs first, or refuses the override; a method the limiter
// does not let through is answered 501. Against the real fleet-limiter binary
// (FLEET_LIMITER_BIN, or the workspace's debug build) and a real Express app.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');
const { spawn } = require('node:child_process');
const express = require('express');
const methodOverride = require('method-override');
const { fleetLimiter } = require('..');

const ROOT = path.join(__dirname, '..', '..', '..');
const BIN = process.env.FLEET_LIMITER_BIN ||
  path.join(path.resolve(ROOT, process.env.CARGO_TARGET_DIR || 'target'), 'debug', 'fleet-limiter');
const DOWNLOAD = '/api/agent/download/linux';

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

async function waitFor(port) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const ok = await new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1', () => { c.destroy(); resolve(true); });
      c.on('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`nothing listens on ${port}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** `fleet-limiter serve` with only the decision endpoint, and these variables. */
async function limiter(vars = {}) {
  const port = await freePort();
  const env = { PATH: process.env.PATH, FLEET_LIMITER_LOG: 'warn', FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION: 'true',
    FLEET_LIMITER_TRUST_PROXY: '127.0.0.1', FLEET_LIMITER_DECISION_ALLOW_FROM: '127.0.0.1', ...vars };
  const log = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'fl-express-mo-')), 'stderr.log');
  const child = spawn(BIN, ['serve', '--decision-listen', `127.0.0.1:${port}`, '--admin-listen', '127.0.0.1:0'],
    { env, stdio: ['ignore', 'ignore', fs.openSync(log, 'w')] });
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  child.unref();
  await Promise.race([
    waitFor(port),
    exited.then((code) => { throw new Error(`fleet-limiter exited (${code}): ${fs.readFileSync(log, 'utf8')}`); }),
  ]);
  return { url: `http://127.0.0.1:${port}`, stop: () => child.kill() };
}

/**
 * An app with method-override (headers X-HTTP-Method-Override and X-HTTP-Method, and the
 * `_method` query parameter, as its README mounts them) and the client, in the given order,
 * before its routes: the download route answers "download", anything else "other: <method>".
 */
function site(decision, order, extra = []) {
  const a = express();
  a.set('trust proxy', false);
  const overrides = [
    methodOverride('X-HTTP-Method-Override'),
    methodOverride('X-HTTP-Method'),
    methodOverride('_method'),
    ...extra,
  ];
  const limit = fleetLimiter({ url: decision });
  if (order === 'limiter first') a.use(limit, ...overrides);
  else a.use(...overrides, limit);
  a.get('/api/agent/download/{*rest}', (req, res) => res.send('download'));
  a.all('/{*any}', (req, res) => res.send(`other: ${req.method}`));
  return new Promise((resolve) => {
    const server = a.listen(0, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() }));
  });
}

/** One request from a loopback address of the client's own. */
function send(url, from, method, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, localAddress: from, headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

let next = 2;
/** A client address no other test uses. */
function someClient() {
  next += 1;
  return `127.0.${Math.floor(next / 250) + 10}.${(next % 250) + 2}`;
}

for (const order of ['limiter first', 'override first']) {
  test(`a POST named GET is charged the download budget (${order})`, async (t) => {
    const fl = await limiter({ FLEET_LIMITER_LIMITER_DOWNLOAD_LIMIT: '3' });
    t.after(fl.stop);
    const app = await site(fl.url, order);
    t.after(app.close);
    const who = someClient();
    for (let i = 0; i < 3; i++) {
      const r = await send(app.url + DOWNLOAD, who, 'GET');
      assert.equal(r.body, 'download');
    }
    // Express would serve every one of these as the download route.
    for (const [target, headers] of [
      [DOWNLOAD, { 'X-HTTP-Method-Override': 'GET' }],
      [DOWNLOAD, { 'x-http-method-override': 'get, post' }],
      [DOWNLOAD, { 'X-HTTP-Method': 'GET' }],
      [`${DOWNLOAD}?_method=GET`, {}],
      [`${DOWNLOAD}?%5Fmethod=get`, {}],
    ]) {
      const r = await send(app.url + target, who, 'POST', headers);
      assert.equal(r.status, 429, `${target} ${JSON.stringify(headers)}: ${r.body}`);
      assert.equal(JSON.parse(r.body).type, 'urn:fleet-limiter:problem:rate-limited');
    }
    // A POST that names nothing is not a download.
    const plain = await send(app.url + DOWNLOAD, who, 'POST');
    assert.equal(plain.status, 200);
    assert.equal(plain.body, 'other: POST');
  });
}

test('an override the client cannot see is metered as the method Express routes on', async (t) => {
  // A getter of the app's own (here a header the client does not know to pass): the client,
  // mounted after it, sends req.originalMethod and names req.method as an override.
  const fl = await limiter({ FLEET_LIMITER_LIMITER_DOWNLOAD_LIMIT: '1' });
  t.after(fl.stop);
  const custom = methodOverride((req) => req.headers['x-verb']);
  const app = await site(fl.url, 'override first', [custom]);
  t.after(app.close);
  const who = someClient();
  assert.equal((await send(app.url + DOWNLOAD, who, 'GET')).body, 'download');
  const r = await send(app.url + DOWNLOAD, who, 'POST', { 'X-Verb': 'GET' });
  assert.equal(r.status, 429, r.body);
  // Under `refuse`, the same request is refused: the limiter is told Express changed its method.
  const fl2 = await limiter({ FLEET_LIMITER_METHOD_OVERRIDE: 'refuse' });
  t.after(fl2.stop);
  const app2 = await site(fl2.url, 'override first', [custom]);
  t.after(app2.close);
  const refused = await send(app2.url + DOWNLOAD, someClient(), 'POST', { 'X-Verb': 'GET' });
  assert.equal(refused.status, 400);
  assert.equal(JSON.parse(refused.body).type, 'urn:fleet-limiter:problem:method-override');
});

test('strip and refuse turn an override away; a method outside the list gets 501', async (t) => {
  for (const mode of ['strip', 'refuse']) {
    const fl = await limiter({ FLEET_LIMITER_METHOD_OVERRIDE: mode });
    t.after(fl.stop);
    for (const order of ['limiter first', 'override first']) {
      const app = await site(fl.url, order);
      t.after(app.close);
      const who = someClient();
      for (const [target, headers] of [
        [DOWNLOAD, { 'X-HTTP-Method-Override': 'GET' }],
        [`${DOWNLOAD}?a=1&_method=GET`, {}],
      ]) {
        const r = await send(app.url + target, who, 'POST', headers);
        assert.equal(r.status, 400, `${mode} ${order} ${target}: ${r.body}`);
        const problem = JSON.parse(r.body);
        assert.equal(problem.type, 'urn:fleet-limiter:problem:method-override');
        assert.match(problem.detail, mode === 'strip' ? /cannot be removed here/ : /refuses method overrides/);
      }
      assert.equal((await send(app.url + DOWNLOAD, who, 'GET')).body, 'download');
    }
  }
  const fl = await limiter();
  t.after(fl.stop);
  const app = await site(fl.url, 'limiter first');
  t.after(app.close);
  for (const method of ['TRACE', 'PROPFIND']) {
    const r = await send(app.url + DOWNLOAD, someClient(), method);
    assert.equal(r.status, 501, `${method}: ${r.body}`);
    assert.equal(r.headers.allow, 'GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS');
    assert.equal(JSON.parse(r.body).type, 'urn:fleet-limiter:problem:unsupported-method');
  }
});
