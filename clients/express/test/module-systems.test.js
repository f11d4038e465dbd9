'use strict';
// The package from both module systems: `require` and `import` give the same client, the
// serverless examples run as CommonJS (examples/serverless.cjs) and as an ES module
// (examples/serverless.mjs) against the real fleet-limiter binary (FLEET_LIMITER_BIN, or the
// workspace's debug build), and the package installs from this repository the two ways
// README.md gives (a tarball from `npm pack`, `npm install --install-links <dir>`) and runs the
// examples there. The install needs npm and its registry or cache (for parseurl): skipped
// without npm, failing when CI is set.

const test = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');
const { spawn, spawnSync } = require('node:child_process');

const PKG = path.join(__dirname, '..');
const ROOT = path.join(PKG, '..', '..');
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

/** `fleet-limiter serve` with only the decision endpoint; this host (127.0.0.1) may ask. */
async function limiter() {
  const port = await freePort();
  const env = { PATH: process.env.PATH, FLEET_LIMITER_LOG: 'warn', FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION: 'true',
    FLEET_LIMITER_TRUST_PROXY: '127.0.0.1', FLEET_LIMITER_DECISION_ALLOW_FROM: '127.0.0.1',
    FLEET_LIMITER_DRAIN_DELAY: '0s',
    // The draft-10 profile names each limiter in RateLimit-Policy, which these tests read.
    FLEET_LIMITER_HEADERS_STANDARD: 'draft-10' };
  const log = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'fl-express-ms-')), 'stderr.log');
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

/** A client address of documentation space (TEST-NET-3), fresh per call. */
function someClient() {
  return `203.0.113.${1 + Math.floor(Math.random() * 254)}`;
}

/**
 * A request as the platform's edge hands it to the function: the client's own
 * X-Forwarded-For (forged, a new address each time) with the edge's entry appended last.
 */
function edgeRequest(client, i) {
  return new Request(`https://fn.example${ROTATE}`, {
    method: 'POST',
    headers: { 'x-forwarded-for': `198.51.100.${10 + i}, ${client}`, 'x-agent-id': `agent-${i}` },
  });
}

test('require and import give the same client', async () => {
  // Self-reference by the package's name goes through its `exports` map, as an app's would.
  const cjs = require('@fleet-limiter/express');
  const esm = await import('@fleet-limiter/express');
  assert.equal(typeof cjs.check, 'function');
  assert.equal(typeof cjs.fleetLimiter, 'function');
  assert.equal(esm.check, cjs.check, 'one copy of the module, not two');
  assert.equal(esm.fleetLimiter, cjs.fleetLimiter);
  assert.equal(esm.default, cjs);
});

for (const example of ['serverless.cjs', 'serverless.mjs']) {
  test(`examples/${example} meters by the edge's address and answers a refusal as the limiter made it`, async (t) => {
    const fl = await limiter();
    t.after(fl.stop);
    process.env.FLEET_LIMITER_URL = fl.url;
    const file = path.join(PKG, 'examples', example);
    const { handler, clientAddress } = example.endsWith('.cjs') ? require(file) : await import(file);
    const who = someClient();
    assert.equal(clientAddress(edgeRequest(who, 0)), who);
    for (let i = 0; i < 3; i++) {
      const res = await handler(edgeRequest(who, i));
      assert.equal(res.status, 200, await res.clone().text());
      assert.deepEqual(await res.json(), { served: ROTATE });
      assert.equal(res.headers.get('ratelimit-policy'), '"key-rotation";q=3;w=900');
      assert.equal(res.headers.get('x-ratelimit-remaining'), String(2 - i));
    }
    // A fourth, with yet another forged address in front: the same client, refused.
    const refused = await handler(edgeRequest(who, 3));
    assert.equal(refused.status, 429);
    assert.equal(refused.headers.get('content-type'), 'application/problem+json');
    const problem = await refused.json();
    assert.equal(problem.type, 'urn:fleet-limiter:problem:rate-limited');
    assert.equal(refused.headers.get('retry-after'), String(problem.retry_after));
    // Another client is served.
    assert.equal((await handler(edgeRequest(someClient(), 4))).status, 200);
  });
}

function run(cmd, args, opts) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', ...opts });
  if (r.error) throw r.error;
  assert.equal(r.status, 0, `${cmd} ${args.join(' ')}:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

/** Both examples, each loaded by its own module system, four requests each, in `dir`. */
const RUN_EXAMPLES = `
import { createRequire } from 'node:module';
import { handler as esm } from './serverless.mjs';
const { handler: cjs } = createRequire(import.meta.url)('./serverless.cjs');
const out = {};
for (const [name, handler, client] of [['mjs', esm, '203.0.113.201'], ['cjs', cjs, '203.0.113.202']]) {
  out[name] = [];
  for (let i = 0; i < 4; i++) {
    const req = new Request('https://fn.example${ROTATE}', { method: 'POST', headers: { 'x-forwarded-for': '198.51.100.' + i + ', ' + client } });
    out[name].push((await handler(req)).status);
  }
}
console.log(JSON.stringify(out));
`;

test('installed from this repository as README.md says, it runs as CommonJS and as an ES module', async (t) => {
  if (spawnSync('npm', ['--version']).error) {
    if (process.env.CI) assert.fail('npm is required when CI is set');
    t.skip('npm is not installed');
    return;
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fl-express-install-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', dir], { cwd: PKG }));
  // The package holds the client and its types, both entries, its licences, README and
  // examples, nothing of the tests.
  const files = packed.files.map((f) => f.path).sort();
  assert.deepEqual(files, [
    'LICENSE-APACHE', 'LICENSE-MIT', 'README.md', 'examples/serverless.cjs', 'examples/serverless.mjs',
    'index.d.mts', 'index.d.ts', 'index.js', 'index.mjs', 'package.json',
  ]);
  const tarball = path.join(dir, packed.filename);
  const quiet = ['--no-audit', '--no-fund', '--prefer-offline'];
  for (const [how, args] of [['tarball', [tarball]], ['install-links', ['--install-links', PKG]]]) {
    const app = path.join(dir, how);
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: `app-${how}`, private: true }));
    run('npm', ['install', ...quiet, ...args], { cwd: app });
    const installed = path.join(app, 'node_modules', '@fleet-limiter', 'express');
    assert.ok(!fs.lstatSync(installed).isSymbolicLink(), `${how}: a copy, not a link to the repository`);
    for (const example of ['serverless.cjs', 'serverless.mjs']) {
      fs.copyFileSync(path.join(PKG, 'examples', example), path.join(app, example));
    }
    fs.writeFileSync(path.join(app, 'run.mjs'), RUN_EXAMPLES);
    const fl = await limiter();
    try {
      const out = JSON.parse(run('node', ['run.mjs'], { cwd: app, env: { ...process.env, FLEET_LIMITER_URL: fl.url } }));
      assert.deepEqual(out, { mjs: [200, 200, 200, 429], cjs: [200, 200, 200, 429] }, how);
    } finally {
      fl.stop();
    }
  }
});
