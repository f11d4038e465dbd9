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
async function limiter({ upstream, redis, extraEnv } = {}) {
  const decision = await freePort();
  const listen = await freePort();
  const args = ['serve', '--decision-listen', `127.0.0.1:${decision}`, '--admin-listen', '127.0.0.1:0'];
  if (upstream) args.push('--listen', `127.0.0.1:${listen}`, '--upstream', upstream);
  const env = { PATH: process.env.PATH, FLEET_LIMITER_LOG: 'warn', FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION: 'true',
    FLEET_LIMITER_TRUST_PROXY: '127.0.0.1', FLEET_LIMITER_DECISION_ALLOW_FROM: '127.0.0.1' };
  // The named items of draft 10 say which limiters metered (test/headers.test.js: every profile).
  env.FLEET_LIMITER_HEADERS_STANDARD = 'draft-10';
  if (redis) env.FLEET_LIMITER_STORE_URL = redis;
  Object.assign(env, extraEnv || {});
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

/** A request with its target sent as written (no URL parsing: `..` and `//` stay). */
function raw(base, method, target, from, headers = {}) {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: hostname, port, method, path: target, localAddress: from, headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** An app whose routes count what reached them: `served` lists `METHOD path` for each. */
function countingApp(opts, before) {
  const a = express();
  const served = [];
  if (before) a.use(before);
  a.use(fleetLimiter(opts));
  a.all('/{*any}', (req, res) => { served.push(`${req.method} ${req.path}`); res.send(`app: ${req.path}`); });
  return new Promise((resolve) => {
    const server = a.listen(0, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${server.address().port}`, served, close: () => server.close() }));
  });
}

function assertRefusedAs(r, cls) {
  assert.equal(r.status, 400, r.body);
  assert.equal(r.headers['content-type'].split(';')[0], 'application/problem+json');
  const problem = JSON.parse(r.body);
  assert.equal(problem.type, 'urn:fleet-limiter:problem:non-canonical-path');
  assert.ok(problem.detail.includes(`(${cls})`), problem.detail);
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

test('a spelling Express would route unrewritten is refused, never metered as another path', async (t) => {
  const fl = await limiter();
  t.after(fl.stop);
  const site = await countingApp({ url: fl.decision });
  t.after(site.close);
  const who = someClient();
  // Key rotation allows 3 in 15 minutes; asked about `req.originalUrl`, 20 of 20 went through
  // unmetered (Express routes `//x/...` as it is, the limiter read `/x/...`).
  for (let i = 0; i < 20; i++) {
    assertRefusedAs(await raw(site.url, 'POST', '//x/api/agent/rotate-key', who), 'empty-segment');
  }
  // Express routes this to the download handler; it was metered as `/api/cron`.
  for (let i = 0; i < 50; i++) {
    assertRefusedAs(await raw(site.url, 'GET', '/api/agent/download/../../cron', who), 'dot-segment');
  }
  assertRefusedAs(await raw(site.url, 'POST', '/api/agent/%72otate-key', who), 'escape-spelling');
  assert.deepEqual(site.served, [], 'no refused request reached a route');
  // The key-rotation budget is untouched.
  for (const left of ['2', '1', '0']) {
    const r = await raw(site.url, 'POST', ROTATE, who);
    assert.equal(r.status, 200, r.body);
    assert.equal(r.headers['x-ratelimit-remaining'], left);
  }
  assert.equal((await raw(site.url, 'POST', ROTATE, who)).status, 429);
});

test('the limiter is told the path Express routes on, whatever the target looked like', async (t) => {
  const fl = await limiter();
  t.after(fl.stop);
  const site = await countingApp({ url: fl.decision });
  t.after(site.close);
  // Absolute-form: Express routes the path; it is metered as key rotation (it was refused).
  const who = someClient();
  for (const left of ['2', '1', '0']) {
    const r = await raw(site.url, 'POST', `http://fleet.test${ROTATE}`, who);
    assert.equal(r.status, 200, r.body);
    assert.equal(r.headers['ratelimit-policy'], '"key-rotation";q=3;w=900');
    assert.equal(r.headers['x-ratelimit-remaining'], left);
  }
  assert.equal((await raw(site.url, 'POST', `http://fleet.test${ROTATE}`, who)).status, 429);
  // A fragment: Express routes `/api/agent/x`, and that is what is metered.
  const frag = await raw(site.url, 'POST', '/api/agent/x#/../rotate-key', someClient());
  assert.equal(frag.status, 200, frag.body);
  assert.equal(frag.body, 'app: /api/agent/x');
  assert.ok(!frag.headers['ratelimit-policy'].includes('key-rotation'), frag.headers['ratelimit-policy']);
  // The client's own original-request headers never reach the limiter: two X-Original-URI and
  // an X-Forwarded-Uri naming another path change nothing.
  const other = someClient();
  const forged = { 'x-original-uri': ['/api/tasks', '/api/tasks'], 'x-forwarded-uri': '/api/tasks', 'x-forwarded-method': 'GET' };
  for (const left of ['2', '1', '0']) {
    const r = await raw(site.url, 'POST', ROTATE, other, forged);
    assert.equal(r.status, 200, r.body);
    assert.equal(r.headers['x-ratelimit-remaining'], left);
  }
  assert.equal((await raw(site.url, 'POST', ROTATE, other, forged)).status, 429);
});

test('under a mount point, or after req.url was rewritten, the path the routes see is metered', async (t) => {
  const fl = await limiter();
  t.after(fl.stop);
  // Mounted at /api: the router sees `/agent/rotate-key`; the limiter is told the whole path.
  const mounted = express();
  const api = express.Router();
  api.use(fleetLimiter({ url: fl.decision }));
  api.post('/agent/rotate-key', (req, res) => res.send('rotated'));
  mounted.use('/api', api);
  const m = await new Promise((resolve) => { const s = mounted.listen(0, '127.0.0.1', () => resolve(s)); });
  t.after(() => m.close());
  const r = await raw(`http://127.0.0.1:${m.address().port}`, 'POST', ROTATE, someClient());
  assert.equal(r.status, 200, r.body);
  assert.equal(r.headers['ratelimit-policy'], '"key-rotation";q=3;w=900');
  // A rewrite before the limiter: the routes see the rewritten path, and so does the limiter.
  const rewrite = (req, res, next) => {
    if (req.url === '/legacy/rotate') req.url = ROTATE;
    next();
  };
  const site = await countingApp({ url: fl.decision }, rewrite);
  t.after(site.close);
  const legacy = await raw(site.url, 'POST', '/legacy/rotate', someClient());
  assert.equal(legacy.status, 200, legacy.body);
  assert.equal(legacy.headers['ratelimit-policy'], '"key-rotation";q=3;w=900');
  assert.deepEqual(site.served, [`POST ${ROTATE}`]);
});

test('a target the limiter cannot be told about is refused, even with onError "allow"', async (t) => {
  // Nothing listens: were the question even attempted, onError "allow" would let it through.
  const dead = `http://127.0.0.1:${await freePort()}`;
  const warned = [];
  const junk = (req, res, next) => {
    if (req.url === '/junk') req.url = '/api/agent/rotate-key\n\u00e9';
    next();
  };
  const site = await countingApp({ url: dead, onLimiterError: (e) => warned.push(e) }, junk);
  t.after(site.close);
  const r = await raw(site.url, 'POST', '/junk', someClient());
  assert.equal(r.status, 400, r.body);
  assert.equal(JSON.parse(r.body).type, 'urn:fleet-limiter:problem:non-canonical-path');
  assert.deepEqual(site.served, []);
  assert.equal(warned.length, 0, 'the limiter was not asked');
  for (const url of ['/a\nb', '/caf\u00e9', 'http://fleet.test/a', '*', '']) {
    const d = await check({ url: dead }, { method: 'GET', url, headers: {} });
    assert.equal(d.allowed, url === '', `${JSON.stringify(url)}: ${d.status}`);
    if (url !== '') assert.equal(d.status, 400);
  }
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

test('a deny limiter whose store cannot answer: the app answers its 503, each caller its own wait', async () => {
  // Nothing listens at the store's address: every decision fails, and key-rotation denies.
  const dead = await freePort();
  const lim = await limiter({
    redis: `redis://127.0.0.1:${dead}`,
    extraEnv: { FLEET_LIMITER_LIMITER_KEY_ROTATION_ON_STORE_ERROR: 'deny' },
  });
  const lines = [];
  const a = await countingApp({ url: lim.decision, warn: (l) => lines.push(l) });
  try {
    const told = new Set();
    for (let i = 0; i < 12; i++) {
      const waits = [];
      for (let k = 0; k < 2; k++) {
        const res = await post(a.url + ROTATE, '127.0.0.1', { 'x-agent-id': `agent-${i}` });
        assert.equal(res.status, 503, res.body);
        assert.equal(JSON.parse(res.body).type, 'urn:fleet-limiter:problem:store-unavailable');
        const wait = Number(res.headers['retry-after']);
        // key-rotation, 3 in 15 minutes: one interval is 300 s, spread up to twice that.
        assert.ok(wait >= 300 && wait <= 600, String(wait));
        assert.equal(JSON.parse(res.body).retry_after, wait);
        assert.match(res.headers.ratelimit, new RegExp(`^"key-rotation";r=0;t=${wait};`));
        waits.push(wait);
      }
      assert.equal(waits[0], waits[1], `agent-${i}: the same wait when it asks again`);
      told.add(waits[0]);
    }
    assert.ok(told.size >= 3, [...told].join(' '));
    assert.deepEqual(a.served, [], 'never reaches a route, whatever onError says');
    assert.deepEqual(lines, [], 'the limiter answered: nothing to warn about');
  } finally {
    a.close();
    lim.stop();
  }
});
