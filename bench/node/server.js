// The Express stack the calibration comes from: express + express-rate-limit v8 with the same
// limiter table fleet-limiter ships (docs/calibration.md), on its MemoryStore or on Redis
// through rate-limit-redis. One process, one core, like every server in bench/run.sh.
//
//   node server.js PORT memory|redis://127.0.0.1:6379 AGENT_DEVICE_LIMIT AGENT_DEVICE_WINDOW_MS
'use strict';
const express = require('express');
const { rateLimit, ipKeyGenerator } = require('express-rate-limit');

const [port, storeArg, agentLimit, agentWindowMs] = process.argv.slice(2);
if (!port || !storeArg || !agentLimit || !agentWindowMs) {
  console.error('usage: node server.js PORT memory|redis://HOST:PORT AGENT_DEVICE_LIMIT AGENT_DEVICE_WINDOW_MS');
  process.exit(2);
}

const MIN = 60 * 1000;
const ip = (req) => ipKeyGenerator(req.ip, 56);
const agentId = (req) => {
  const raw = req.get('x-agent-id');
  return raw && /^[A-Za-z0-9._:-]{1,128}$/.test(raw) ? raw : 'none';
};
const bearer = (req) => {
  const h = req.get('authorization') || '';
  return h.startsWith('Bearer ') ? h.slice(7).trim() : '';
};

async function main() {
  let makeStore = () => undefined; // express-rate-limit's MemoryStore
  if (storeArg.startsWith('redis://')) {
    const { createClient } = require('redis');
    const { RedisStore } = require('rate-limit-redis');
    const client = createClient({ url: storeArg });
    client.on('error', (e) => console.error('redis:', e.message));
    await client.connect();
    makeStore = (name) => new RedisStore({ sendCommand: (...args) => client.sendCommand(args), prefix: `erl:${name}:` });
  }
  const limiter = (name, limit, windowMs, keyGenerator, skip) =>
    rateLimit({
      windowMs,
      limit,
      keyGenerator,
      skip,
      standardHeaders: 'draft-8',
      legacyHeaders: false,
      identifier: name,
      store: makeStore(name),
    });

  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');
  const under = (p, prefixes) => prefixes.some((x) => p === x || p.startsWith(x + '/'));
  const agentOwn = ['/api/agent/enroll', '/api/agent/rotate-key'];

  // The agent group: lifecycle endpoints have their own budgets, every other agent route
  // shares agent-device, keyed on client IP + agent id.
  app.post('/api/agent/enroll', limiter('enrollment', 300, 15 * MIN, ip));
  app.get('/api/agent/download/*splat', limiter('download', 300, 15 * MIN, ip));
  app.post('/api/agent/rotate-key', limiter('key-rotation', 3, 15 * MIN, ip));
  app.use(
    '/api/agent',
    limiter('agent-device', Number(agentLimit), Number(agentWindowMs), (req) => `${ip(req)}:${agentId(req)}`, (req) =>
      agentOwn.includes(req.originalUrl.split('?')[0]) || req.originalUrl.startsWith('/api/agent/download/'),
    ),
  );
  // Dashboard, CLI and API-key budgets (none applies to agent routes).
  app.use(
    '/api',
    limiter('ui', 1000, 15 * MIN, (req) => ip(req), (req) =>
      under(req.originalUrl, ['/api/agent', '/api/cron', '/api/cli/auth']),
    ),
  );
  app.use('/api', limiter('cli-bearer', 60, MIN, ip, (req) => under(req.originalUrl, ['/api/agent']) || !bearer(req).startsWith('cli_')));
  app.use('/api', limiter('api-key', 60, MIN, ip, (req) => under(req.originalUrl, ['/api/agent']) || !req.get('x-api-key')));
  app.post('/api/cli/auth/device/code', limiter('cli-device-code', 10, MIN, ip));
  app.post('/api/cli/auth/device/token', limiter('cli-device-poll', 60, MIN, ip));
  app.post('/api/cli/auth/refresh', limiter('cli-refresh', 10, MIN, ip));

  app.post('/api/agent/heartbeat', express.json(), (req, res) => res.type('text/plain').send('ok'));
  app.listen(Number(port), '127.0.0.1', () => console.error(`express listening on 127.0.0.1:${port} (${storeArg})`));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
