'use strict';
// The client address the middleware sends is req.ip, as Express computes it under the app's own
// `trust proxy` setting. Against the real fleet-limiter binary (FLEET_LIMITER_BIN, or the
// workspace's debug build), a real Express app, and for the one-proxy case the real nginx
// (skipped without it, failing when CI is set): a forged X-Forwarded-For buys no budget with
// the settings README.md gives, and does with the ones it warns against.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');
const { spawn, spawnSync } = require('node:child_process');
const express = require('express');
const { fleetLimiter } = require('..');

const ROOT = path.join(__dirname, '..', '..', '..');
const BIN = process.env.FLEET_LIMITER_BIN ||
  path.join(path.resolve(ROOT, process.env.CARGO_TARGET_DIR || 'target'), 'debug', 'fleet-limiter');
// key-rotation: 3 in 15 minutes per client address.
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

/** `fleet-limiter serve` with only the decision endpoint; the app (127.0.0.1) may ask. */
async function limiter() {
  const port = await freePort();
  const env = { PATH: process.env.PATH, FLEET_LIMITER_LOG: 'warn', FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION: 'true',
    FLEET_LIMITER_TRUST_PROXY: '127.0.0.1', FLEET_LIMITER_DECISION_ALLOW_FROM: '127.0.0.1',
    FLEET_LIMITER_DRAIN_DELAY: '0s' };
  const log = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'fl-express-tp-')), 'stderr.log');
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
 * An Express app with the middleware, `configure` applied first (e.g. a `trust proxy`
 * setting); answers with the address Express computed.
 */
function app(url, configure = () => {}) {
  const a = express();
  configure(a);
  a.use(fleetLimiter({ url }));
  a.all('/{*any}', (req, res) => res.send(`ip: ${req.ip}`));
  return new Promise((resolve) => {
    const server = a.listen(0, '127.0.0.1', () => resolve({ port: server.address().port, close: () => server.close() }));
  });
}

/** POST from a loopback address of the client's own, with these headers. */
function post(port, from, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: ROTATE, method: 'POST', localAddress: from, headers, agent: false }, (res) => {
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

/** A fresh forged address per request, as a budget buyer sends. */
function forged(i) {
  return `198.51.100.${10 + i}`;
}

/** Nine requests from one client, each with a new forged X-Forwarded-For: their statuses. */
async function rotateWithForgedAddresses(port, who) {
  const statuses = [];
  for (let i = 0; i < 9; i++) {
    statuses.push((await post(port, who, { 'x-forwarded-for': forged(i) })).status);
  }
  return statuses;
}

test('an app behind no proxy cannot buy budgets with a forged X-Forwarded-For', async (t) => {
  const fl = await limiter();
  t.after(fl.stop);
  // Express's default: `trust proxy` unset, req.ip is the connection's peer.
  const site = await app(fl.url);
  t.after(site.close);
  const who = someClient();
  assert.deepEqual(await rotateWithForgedAddresses(site.port, who), [200, 200, 200, 429, 429, 429, 429, 429, 429]);
  // Forged Forwarded and X-Real-IP change nothing either.
  const other = await post(site.port, who, { forwarded: 'for=203.0.113.77', 'x-real-ip': '203.0.113.78' });
  assert.equal(other.status, 429);
  // The budget is the client's own: another client is served.
  const next = someClient();
  const served = await post(site.port, next, { 'x-forwarded-for': forged(0) });
  assert.equal(served.status, 200, served.body);
  assert.equal(served.body, `ip: ${next}`);
});

test('`trust proxy` on an app clients reach directly lets forged addresses buy budgets', async (t) => {
  // What README.md warns against: the setting for one proxy hop, with no proxy in front.
  const fl = await limiter();
  t.after(fl.stop);
  for (const setting of [1, true]) {
    const site = await app(fl.url, (a) => a.set('trust proxy', setting));
    t.after(site.close);
    const statuses = await rotateWithForgedAddresses(site.port, someClient());
    assert.deepEqual(statuses, [200, 200, 200, 200, 200, 200, 200, 200, 200], `trust proxy ${setting}`);
  }
});

test('overrideHeaders cannot pass the caller\'s own forwarding headers on', () => {
  for (const name of ['x-forwarded-for', 'X-Forwarded-For', ' forwarded ', 'X-Real-IP', 'x-forwarded-uri', 'x-original-method', 'host']) {
    assert.throws(() => fleetLimiter({ url: 'http://127.0.0.1:1', overrideHeaders: [name] }), /overrideHeaders` cannot name/, name);
  }
  assert.doesNotThrow(() => fleetLimiter({ url: 'http://127.0.0.1:1', overrideHeaders: ['x-tunnel-method'] }));
});

function nginxBinary() {
  for (const bin of ['/usr/sbin/nginx', 'nginx']) {
    const r = spawnSync(bin, ['-v'], { stdio: 'ignore' });
    if (!r.error) return bin;
  }
  return null;
}

/** The real nginx on a free port, proxying to the app and appending to X-Forwarded-For. */
async function nginx(t, bin, appPort) {
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fl-express-nginx-'));
  const conf = `worker_processes 1;
daemon off;
error_log ${dir}/error.log warn;
pid ${dir}/nginx.pid;
events {}
http {
  access_log off;
  client_body_temp_path ${dir}/t1;
  proxy_temp_path ${dir}/t2;
  fastcgi_temp_path ${dir}/t3;
  uwsgi_temp_path ${dir}/t4;
  scgi_temp_path ${dir}/t5;
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://127.0.0.1:${appPort};
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    }
  }
}
`;
  fs.writeFileSync(path.join(dir, 'nginx.conf'), conf);
  const child = spawn(bin, ['-p', dir, '-c', path.join(dir, 'nginx.conf'), '-e', path.join(dir, 'error.log')], { stdio: 'ignore' });
  child.unref();
  t.after(() => child.kill());
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  await Promise.race([
    waitFor(port),
    exited.then((code) => { throw new Error(`nginx exited (${code}): ${fs.readFileSync(path.join(dir, 'error.log'), 'utf8')}`); }),
  ]);
  return port;
}

test('behind one proxy hop, `trust proxy` 1 keys each client on the address the proxy saw', async (t) => {
  const bin = nginxBinary();
  if (!bin) {
    if (process.env.CI) assert.fail('nginx is required when CI is set (apt-get install nginx-light)');
    t.skip('nginx is not installed (apt-get install nginx-light)');
    return;
  }
  const fl = await limiter();
  t.after(fl.stop);
  const site = await app(fl.url, (a) => a.set('trust proxy', 1));
  t.after(site.close);
  const proxy = await nginx(t, bin, site.port);
  // nginx appends the address it accepted the connection from; Express takes that one, not the
  // client's forged entries before it.
  const who = someClient();
  const first = await post(proxy, who, { 'x-forwarded-for': forged(0) });
  assert.equal(first.status, 200, first.body);
  assert.equal(first.body, `ip: ${who}`);
  const rest = [];
  for (let i = 1; i < 9; i++) rest.push((await post(proxy, who, { 'x-forwarded-for': forged(i) })).status);
  assert.deepEqual(rest, [200, 200, 429, 429, 429, 429, 429, 429]);
  const next = someClient();
  const served = await post(proxy, next);
  assert.equal(served.status, 200, served.body);
  assert.equal(served.body, `ip: ${next}`);

  // `trust proxy` true behind the same proxy: Express takes the leftmost entry, the client's.
  const open = await app(fl.url, (a) => a.set('trust proxy', true));
  t.after(open.close);
  const openProxy = await nginx(t, bin, open.port);
  assert.deepEqual(await rotateWithForgedAddresses(openProxy, someClient()), [200, 200, 200, 200, 200, 200, 200, 200, 200]);
});

test('behind a proxy with `trust proxy` unset, every client shares the proxy\'s budget', async (t) => {
  // What README.md warns of the other way: nobody can forge, but everyone is one client.
  const bin = nginxBinary();
  if (!bin) {
    if (process.env.CI) assert.fail('nginx is required when CI is set (apt-get install nginx-light)');
    t.skip('nginx is not installed (apt-get install nginx-light)');
    return;
  }
  const fl = await limiter();
  t.after(fl.stop);
  const site = await app(fl.url);
  t.after(site.close);
  const proxy = await nginx(t, bin, site.port);
  const statuses = [];
  for (let i = 0; i < 4; i++) {
    const r = await post(proxy, someClient());
    if (r.status === 200) assert.equal(r.body, 'ip: 127.0.0.1', 'req.ip is the proxy');
    statuses.push(r.status);
  }
  assert.deepEqual(statuses, [200, 200, 200, 429], 'four clients, one budget of three');
});
