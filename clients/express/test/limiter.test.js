'use strict';
// Against the real fleet-limiter binary (FLEET_LIMITER_BIN, or the workspace's debug build) and
// a real Express app. The shared-budget test needs Redis (REDIS_URL): skipped without it,
// failing when CI is set.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');
const { spawn } = require('node:child_process');
const express = require('express');
const { fleetLimiter, check } = require('..');

const ROOT = path.join(__dirname, '..', '..', '..');
// The binary `cargo test` built: FLEET_LIMITER_BIN, else under CARGO_TARGET_DIR, else target/.
const BIN = process.env.FLEET_LIMITER_BIN ||
  path.join(path.resolve(ROOT, process.env.CARGO_TARGET_DIR || 'target'), 'debug', 'fleet-limiter');
const ROTATE = '/api/agent/rotate-key';

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

/** fleet-limiter serve with the decision endpoint (and a gateway when `upstream` is given). */
async function limiter({ upstream, redis } = {}) {
  const decision = await freePort();
  const listen = await freePort();
  const args = ['serve', '--decision-listen', `127.0.0.1:${decision}`, '--admin-listen', '127.0.0.1:0'];
  if (upstream) args.push('--listen', `127.0.0.1:${listen}`, '--upstream', upstream);
  const env = { PATH: process.env.PATH, FLEET_LIMITER_LOG: 'warn', FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION: 'true',
    FLEET_LIMITER_TRUST_PROXY: '127.0.0.1', FLEET_LIMITER_DECISION_ALLOW_FROM: '127.0.0.1' };
  if (redis) env.FLEET_LIMITER_STORE_URL = redis;
  const log = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'fl-express-')), 'stderr.log');
  const child = spawn(BIN, args, { env, stdio: ['ignore', 'ignore', fs.openSync(log, 'w')] });
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  // A limiter that does not stop must not hold the test run open.
  child.unref();
  await Promise.race([
    Promise.all([waitFor(decision), upstream ? waitFor(listen) : null]),
    exited.then((code) => { throw new Error(`fleet-limiter exited (${code}): ${fs.readFileSync(log, 'utf8')}`); }),
  ]);
  return { decision: `http://127.0.0.1:${decision}`, gateway: `http://127.0.0.1:${listen}`, stop: () => child.kill() };
}

/** An Express app behind the middleware; answers "app: <path>". */
function app(opts) {
  const a = express();
  a.set('trust proxy', false);
  a.use(fleetLimiter(opts));
  a.all('/{*any}', (req, res) => res.send(`app: ${req.path}`));
  return new Promise((resolve) => {
    const server = a.listen(0, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() }));
  });
}

/** POST from a loopback address of the client's own. */
function post(url, from, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'POST', localAddress: from, headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

function someClient() {
  return `127.${1 + Math.floor(Math.random() * 250)}.${Math.floor(Math.random() * 250)}.${2 + Math.floor(Math.random() * 250)}`;
}

test('the middleware meters like the gateway and answers 429 the same way', async (t) => {
  const fl = await limiter();
  t.after(fl.stop);
  const site = await app({ url: fl.decision });
  t.after(site.close);
  const who = someClient();
  for (const left of ['2', '1', '0']) {
    const r = await post(site.url + ROTATE, who);
    assert.equal(r.status, 200, r.body);
    assert.equal(r.body, `app: ${ROTATE}`);
    assert.equal(r.headers['x-ratelimit-remaining'], left);
    assert.equal(r.headers['ratelimit-policy'], '"key-rotation";q=3;w=900');
    assert.equal(r.headers['retry-after'], undefined);
  }
  const refused = await post(site.url + ROTATE, who);
  assert.equal(refused.status, 429);
  assert.equal(refused.headers['content-type'].split(';')[0], 'application/problem+json');
  const problem = JSON.parse(refused.body);
  assert.equal(problem.type, 'urn:fleet-limiter:problem:rate-limited');
  assert.equal(refused.headers['retry-after'], String(problem.retry_after));
  assert.ok(problem.retry_after >= 1);
  // Another client has its own budget; a forged agent id or X-Forwarded-For changes nothing.
  assert.equal((await post(site.url + ROTATE, someClient())).status, 200);
  const forged = await post(site.url + ROTATE, who, { 'x-forwarded-for': '198.51.100.7', 'x-agent-id': 'agent-9' });
  assert.equal(forged.status, 429);
  // A path the limiter will not read is refused as the gateway refuses it.
  const odd = await post(site.url + '/api/agent/a%2Frotate-key', who);
  assert.equal(odd.status, 400);
  assert.equal(JSON.parse(odd.body).type, 'urn:fleet-limiter:problem:non-canonical-path');
});

test('an unreachable limiter gets the configured answer, fast', async (t) => {
  const dead = `http://127.0.0.1:${await freePort()}`;
  const warned = [];
  const open = await app({ url: dead, onLimiterError: (e) => warned.push(e) });
  t.after(open.close);
  const r = await post(open.url + ROTATE, someClient());
  assert.equal(r.status, 200);
  assert.equal(warned.length, 1);
  const closed = await app({ url: dead, onError: 'deny', onLimiterError: () => {} });
  t.after(closed.close);
  const d = await post(closed.url + ROTATE, someClient());
  assert.equal(d.status, 503);
  assert.equal(JSON.parse(d.body).type, 'urn:fleet-limiter:problem:limiter-unreachable');
  assert.throws(() => fleetLimiter({}), /url/);
  assert.throws(() => fleetLimiter({ url: dead, onError: 'maybe' }), /onError/);
});

test('check() is the same decision for a serverless function', async (t) => {
  const fl = await limiter();
  t.after(fl.stop);
  const ip = someClient();
  const q = { method: 'POST', url: `${ROTATE}?reason=x`, ip, headers: {} };
  for (let i = 0; i < 3; i++) assert.equal((await check({ url: fl.decision }, q)).allowed, true);
  const refused = await check({ url: fl.decision }, q);
  assert.equal(refused.allowed, false);
  assert.equal(refused.status, 429);
  assert.ok(Number(refused.headers['retry-after']) >= 1);
});

test('an Express app and a gateway on one Redis share one budget', async (t) => {
  const redis = process.env.REDIS_URL;
  if (!redis) {
    if (process.env.CI) assert.fail('REDIS_URL is required when CI is set');
    t.skip('REDIS_URL not set');
    return;
  }
  const site0 = express();
  site0.all('/{*any}', (req, res) => res.send('upstream'));
  const up = await new Promise((resolve) => { const s = site0.listen(0, '127.0.0.1', () => resolve(s)); });
  t.after(() => up.close());
  const gateway = await limiter({ upstream: `http://127.0.0.1:${up.address().port}`, redis });
  t.after(gateway.stop);
  const decider = await limiter({ redis });
  t.after(decider.stop);
  const site = await app({ url: decider.decision });
  t.after(site.close);
  const who = someClient();
  assert.equal((await post(gateway.gateway + ROTATE, who)).status, 200);
  assert.equal((await post(gateway.gateway + ROTATE, who)).status, 200);
  const last = await post(site.url + ROTATE, who);
  assert.equal(last.status, 200);
  assert.equal(last.headers['x-ratelimit-remaining'], '0');
  assert.equal((await post(site.url + ROTATE, who)).status, 429);
  assert.equal((await post(gateway.gateway + ROTATE, who)).status, 429);
});
