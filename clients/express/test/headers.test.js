'use strict';
// Every `[headers]` profile of the real fleet-limiter binary (FLEET_LIMITER_BIN, or the
// workspace's debug build) through the middleware in a real Express app: the app's answers
// carry exactly the limit headers the profile sends, with the limiter's values, allowed and
// refused; on the refusal every reset is Retry-After.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');
const { spawn } = require('node:child_process');
const express = require('express');
const { fleetLimiter } = require('..');

const ROOT = path.join(__dirname, '..', '..', '..');
const BIN = process.env.FLEET_LIMITER_BIN ||
  path.join(path.resolve(ROOT, process.env.CARGO_TARGET_DIR || 'target'), 'debug', 'fleet-limiter');
const ROTATE = '/api/agent/rotate-key';
const NAMES = ['ratelimit', 'ratelimit-policy', 'ratelimit-limit', 'ratelimit-remaining', 'ratelimit-reset',
  'x-ratelimit-limit', 'x-ratelimit-remaining', 'x-ratelimit-reset'];

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

/** The decision endpoint of fleet-limiter with the given `[headers]` variables. */
async function limiter(vars) {
  const decision = await freePort();
  const env = { PATH: process.env.PATH, FLEET_LIMITER_LOG: 'warn', FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION: 'true',
    FLEET_LIMITER_TRUST_PROXY: '127.0.0.1', FLEET_LIMITER_DECISION_ALLOW_FROM: '127.0.0.1', ...vars };
  const log = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'fl-express-')), 'stderr.log');
  const child = spawn(BIN, ['serve', '--decision-listen', `127.0.0.1:${decision}`, '--admin-listen', '127.0.0.1:0'],
    { env, stdio: ['ignore', 'ignore', fs.openSync(log, 'w')] });
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  child.unref();
  await Promise.race([
    waitFor(decision),
    exited.then((code) => { throw new Error(`fleet-limiter exited (${code}): ${fs.readFileSync(log, 'utf8')}`); }),
  ]);
  return { url: `http://127.0.0.1:${decision}`, stop: () => child.kill() };
}

function app(url) {
  const a = express();
  a.set('trust proxy', false);
  a.use(fleetLimiter({ url }));
  a.all('/{*any}', (req, res) => res.send(`app: ${req.path}`));
  return new Promise((resolve) => {
    const server = a.listen(0, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() }));
  });
}

function post(url) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'POST', agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers }));
    });
    req.on('error', reject);
    req.end();
  });
}

function sent(standard, legacy) {
  const names = { off: [], 'draft-6': ['ratelimit-policy', 'ratelimit-limit', 'ratelimit-remaining', 'ratelimit-reset'] }[standard] ??
    ['ratelimit', 'ratelimit-policy'];
  return (legacy ? [...names, 'x-ratelimit-limit', 'x-ratelimit-remaining', 'x-ratelimit-reset'] : names).sort();
}

/** What remains and every reset (in seconds from now) the answer states, as its profile writes them. */
function read(h, standard, unix) {
  const remaining = [];
  const resets = [];
  if (standard === 'draft-6') {
    remaining.push(Number(h['ratelimit-remaining']));
    resets.push(Number(h['ratelimit-reset']));
  } else if (standard === 'draft-7') {
    const key = (k) => Number(new RegExp(`(?:^|,\\s*)${k}=(\\d+)`).exec(h.ratelimit)[1]);
    remaining.push(key('remaining'));
    resets.push(key('reset'));
  } else if (standard !== 'off') {
    const item = h.ratelimit.split(',').find((i) => i.trim().startsWith('"key-rotation"'));
    remaining.push(Number(/;r=(\d+)/.exec(item)[1]));
    const t = /;t=(\d+)/.exec(item);
    if (t) resets.push(Number(t[1]));
  }
  if (h['x-ratelimit-remaining'] !== undefined) {
    remaining.push(Number(h['x-ratelimit-remaining']));
    const reset = Number(h['x-ratelimit-reset']);
    resets.push(unix ? reset - Date.now() / 1000 : reset);
  }
  return { remaining, resets };
}

for (const standard of ['draft-10', 'draft-8', 'draft-7', 'draft-6', 'off']) {
  for (const [legacy, reset] of [[false, 'unix'], [true, 'unix'], [true, 'delta']]) {
    const profile = `${standard}${legacy ? `+legacy(${reset})` : ''}`;
    test(`the app's answers carry the ${profile} headers`, async (t) => {
      const fl = await limiter({ FLEET_LIMITER_HEADERS_STANDARD: standard, FLEET_LIMITER_HEADERS_LEGACY: String(legacy),
        FLEET_LIMITER_HEADERS_LEGACY_RESET: reset });
      t.after(fl.stop);
      const site = await app(fl.url);
      t.after(site.close);
      for (const n of [1, 2, 3, 4]) {
        const r = await post(site.url + ROTATE);
        const names = NAMES.filter((k) => r.headers[k] !== undefined).sort();
        assert.deepEqual(names, sent(standard, legacy), `${profile}, request ${n}`);
        const { remaining, resets } = read(r.headers, standard, legacy && reset === 'unix');
        if (n <= 3) {
          assert.equal(r.status, 200);
          assert.ok(remaining.every((x) => x === 3 - n), `${profile}: ${JSON.stringify(r.headers)}`);
        } else {
          assert.equal(r.status, 429);
          const retry = Number(r.headers['retry-after']);
          assert.ok(retry >= 1, r.headers['retry-after']);
          assert.ok(remaining.every((x) => x === 0), `${profile}: ${JSON.stringify(r.headers)}`);
          for (const s of resets) {
            assert.ok(Math.abs(s - retry) <= 1, `${profile}: a reset of ${s} s beside Retry-After ${retry}`);
          }
        }
      }
    });
  }
}
