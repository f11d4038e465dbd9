'use strict';
// When the limiter cannot be reached: a warning at most once per `warnIntervalMs`, saying how
// many requests went through unchecked meanwhile, and `onFailOpen` for every one of them; and
// the package ships what it says (LICENSE files, README, examples, types). No binary needed:
// the limiter is an address where nothing listens, or a fetch that fails.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const express = require('express');
const { fleetLimiter, check } = require('..');

const question = { method: 'GET', url: '/api/tasks', ip: '198.51.100.7', headers: {} };

function unreachable() {
  return async () => { throw new Error('connect ECONNREFUSED 127.0.0.1:9'); };
}

test('a failing limiter is warned about once per interval, with what went through', async () => {
  const lines = [];
  const opened = [];
  const opts = {
    url: 'http://127.0.0.11:9',
    fetch: unreachable(),
    warn: (l) => lines.push(l),
    onFailOpen: (error, req) => opened.push([error.message, req.url]),
  };
  for (let i = 0; i < 5; i++) {
    const d = await check(opts, question);
    assert.equal(d.allowed, true);
    assert.equal(d.status, 200);
  }
  assert.equal(lines.length, 1, lines.join('\n'));
  assert.match(lines[0], /cannot be reached \(connect ECONNREFUSED/);
  assert.match(lines[0], /1 request\(s\) let through unchecked/);
  assert.equal(opened.length, 5, 'the hook hears of every request');
  assert.deepEqual(opened[0], ['connect ECONNREFUSED 127.0.0.1:9', '/api/tasks']);
  // Every time, when asked to.
  const every = [];
  for (let i = 0; i < 3; i++) {
    await check({ ...opts, url: 'http://127.0.0.12:9', warnIntervalMs: 0, warn: (l) => every.push(l) }, question);
  }
  assert.equal(every.length, 3);
});

test('the count since the last warning is told when the interval has passed', async () => {
  const lines = [];
  const opts = { url: 'http://127.0.0.13:9', fetch: unreachable(), warn: (l) => lines.push(l), warnIntervalMs: 50 };
  for (let i = 0; i < 4; i++) await check(opts, question);
  await new Promise((r) => setTimeout(r, 80));
  await check(opts, question);
  assert.equal(lines.length, 2, lines.join('\n'));
  assert.match(lines[1], /4 request\(s\) let through unchecked/, 'three unsaid, and this one');
});

test('failing closed is warned about too, and is no fail-open', async () => {
  const lines = [];
  let hooked = 0;
  const d = await check({
    url: 'http://127.0.0.14:9', fetch: unreachable(), onError: 'deny',
    warn: (l) => lines.push(l), onFailOpen: () => { hooked += 1; },
  }, question);
  assert.equal(d.allowed, false);
  assert.equal(d.status, 503);
  assert.match(lines[0], /answered 503 \(onError: "deny"\)/);
  assert.equal(hooked, 0);
});

test('a 503 for a store that cannot answer is the limiter\'s refusal, never a failure to reach it', async () => {
  const problem = JSON.stringify({
    type: 'urn:fleet-limiter:problem:store-unavailable',
    title: 'Service Unavailable',
    status: 503,
    detail: 'The rate limiter\'s store cannot answer; retry after 417 seconds.',
    retry_after: 417,
  });
  const storeDown = async () => new Response(problem, {
    status: 503,
    headers: { 'content-type': 'application/problem+json', 'retry-after': '417', 'ratelimit-reset': '417' },
  });
  for (const onError of ['allow', 'deny']) {
    const lines = [];
    let hooked = 0;
    const d = await check({
      url: 'http://127.0.0.17:9', fetch: storeDown, onError,
      warn: (l) => lines.push(l), onFailOpen: () => { hooked += 1; },
    }, question);
    assert.equal(d.allowed, false, onError);
    assert.equal(d.status, 503, onError);
    assert.equal(d.error, undefined, 'the limiter answered: nothing failed here');
    assert.equal(d.headers['retry-after'], '417', 'its own wait, not 1');
    assert.equal(d.headers['ratelimit-reset'], '417');
    assert.equal(JSON.parse(d.body).type, 'urn:fleet-limiter:problem:store-unavailable');
    assert.deepEqual(lines, [], 'no unreachable-limiter warning');
    assert.equal(hooked, 0, 'never let through unchecked');
  }
  // Any other 5xx is still a limiter that cannot answer: onError decides.
  const broken = async () => new Response('oops', { status: 503 });
  const d = await check({ url: 'http://127.0.0.18:9', fetch: broken, warn: () => {} }, question);
  assert.equal(d.allowed, true);
  assert.match(d.error.message, /answered 503/);
});

test('a hook or a logger that throws decides nothing', async () => {
  const d = await check({
    url: 'http://127.0.0.15:9', fetch: unreachable(),
    warn: () => { throw new Error('logger down'); },
    onFailOpen: () => { throw new Error('hook down'); },
  }, question);
  assert.equal(d.allowed, true);
  assert.throws(() => fleetLimiter({ url: 'http://127.0.0.1:9', onFailOpen: 'yes' }), /onFailOpen/);
  assert.throws(() => fleetLimiter({ url: 'http://127.0.0.1:9', warnIntervalMs: -1 }), /warnIntervalMs/);
});

test('the middleware lets requests through a dead limiter and says so once', async () => {
  const lines = [];
  const opened = [];
  const app = express();
  app.use(fleetLimiter({
    url: 'http://127.0.0.16:9', timeoutMs: 200,
    warn: (l) => lines.push(l), onFailOpen: (e, req) => opened.push(req.url),
  }));
  app.get('/api/tasks', (req, res) => res.send('ok'));
  const server = http.createServer(app);
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address();
  try {
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`http://127.0.0.1:${port}/api/tasks`);
      assert.equal(res.status, 200);
      assert.equal(await res.text(), 'ok');
    }
  } finally {
    server.close();
  }
  assert.equal(lines.length, 1, lines.join('\n'));
  assert.deepEqual(opened, ['/api/tasks', '/api/tasks', '/api/tasks']);
});

test('the package ships its licences, README, examples and types', () => {
  const out = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], {
    cwd: path.join(__dirname, '..'),
    encoding: 'utf8',
  });
  const files = JSON.parse(out)[0].files.map((f) => f.path).sort();
  for (const f of ['LICENSE-APACHE', 'LICENSE-MIT', 'README.md', 'examples/serverless.cjs',
    'examples/serverless.mjs', 'index.d.mts', 'index.d.ts', 'index.js', 'index.mjs', 'package.json']) {
    assert.ok(files.includes(f), `${f} in ${files.join(', ')}`);
  }
  assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('node_modules/')), files.join(', '));
});
