'use strict';
// fleet-limiter's client: asks the decision endpoint (`decision.listen`, path `/forward`)
// whether a request may pass, with the same keys and budgets as the gateway and every other
// client of the same store. `check()` is plain `fetch` (serverless functions, any framework);
// `fleetLimiter()` is Express middleware built on it.
//
// The limiter meters the path it is told, and only a path that is its own canonical form: the
// middleware tells it the path Express routes on (parsed as Express's router parses it), and
// answers a refusal, such as a 400 for `//x/…` or `/a/../b`, without calling next().

const parseurl = require('parseurl');

/** The headers the decision endpoint reads from the original request. */
const PASSED = ['x-agent-id', 'authorization', 'cookie'];
/**
 * Method override headers (the limiter's `methods.override_headers`): the limiter meters a
 * request as every method they name, or refuses it, so it must see them as the app does.
 */
const OVERRIDE_HEADERS = ['x-http-method-override', 'x-http-method', 'x-method-override'];
/**
 * Headers the client writes itself, or that name the original request: never taken from the
 * app's request, so an `overrideHeaders` list cannot let the caller's own copy through.
 */
const RESERVED = new Set([
  'x-forwarded-for', 'forwarded', 'x-real-ip', 'x-forwarded-host', 'x-forwarded-proto',
  'x-forwarded-method', 'x-forwarded-uri', 'x-original-method', 'x-original-uri', 'host',
]);
/**
 * The headers of its answer that belong on the client's answer: every limit header of every
 * `[headers]` profile (the limiter sends those of the profile in force), then the others.
 */
const LIMIT_HEADERS = [
  'ratelimit-policy',
  'ratelimit',
  'ratelimit-limit',
  'ratelimit-remaining',
  'ratelimit-reset',
  'x-ratelimit-limit',
  'x-ratelimit-remaining',
  'x-ratelimit-reset',
  'retry-after',
  'allow',
];
const UNREACHABLE = {
  type: 'urn:fleet-limiter:problem:limiter-unreachable',
  title: 'Service Unavailable',
  status: 503,
  detail: 'The rate limiter could not be reached; try again shortly.',
};
/** A target the limiter can be told: visible ASCII, starting with `/`. */
const SENDABLE = /^\/[\x21-\x7e]*$/;
/** The answer for a target that cannot be: refused here, as the limiter would refuse it. */
function unsendable() {
  return {
    allowed: false,
    status: 400,
    headers: {},
    body: JSON.stringify({
      type: 'urn:fleet-limiter:problem:non-canonical-path',
      title: 'Bad Request',
      status: 400,
      detail: 'The request target is not a path of visible ASCII characters starting with `/`, so the rate limiter cannot be asked about it; send the path percent-encoded.',
    }),
  };
}

function options(opts) {
  if (!opts || typeof opts.url !== 'string') {
    throw new TypeError('fleet-limiter: `url` is required: the decision endpoint, e.g. "http://127.0.0.1:7392"');
  }
  const url = new URL('/forward', opts.url).toString();
  const timeoutMs = opts.timeoutMs ?? 250;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new TypeError('fleet-limiter: `timeoutMs` must be a positive number of milliseconds');
  }
  const onError = opts.onError ?? 'allow';
  if (onError !== 'allow' && onError !== 'deny') {
    throw new TypeError('fleet-limiter: `onError` is "allow" (the default) or "deny"');
  }
  const extra = opts.overrideHeaders ?? [];
  if (!Array.isArray(extra) || !extra.every((h) => typeof h === 'string')) {
    throw new TypeError('fleet-limiter: `overrideHeaders` is a list of header names');
  }
  const reserved = extra.find((h) => RESERVED.has(h.trim().toLowerCase()));
  if (reserved !== undefined) {
    throw new TypeError(`fleet-limiter: \`overrideHeaders\` cannot name ${reserved}: the client sets it from the request Express parsed (the address from req.ip, the method and path it routes on); a copy from the caller would let it choose them`);
  }
  const passed = [...new Set([...PASSED, ...OVERRIDE_HEADERS, ...extra.map((h) => h.trim().toLowerCase())])];
  const warnIntervalMs = opts.warnIntervalMs ?? 60_000;
  if (!Number.isFinite(warnIntervalMs) || warnIntervalMs < 0) {
    throw new TypeError('fleet-limiter: `warnIntervalMs` must be a number of milliseconds, 0 or more');
  }
  if (opts.onFailOpen !== undefined && typeof opts.onFailOpen !== 'function') {
    throw new TypeError('fleet-limiter: `onFailOpen` must be a function (error, request) => void');
  }
  const warn = opts.warn ?? ((line) => console.warn(line));
  if (typeof warn !== 'function') {
    throw new TypeError('fleet-limiter: `warn` must be a function (line) => void');
  }
  return {
    url, timeoutMs, onError, passed, fetch: opts.fetch ?? globalThis.fetch,
    warnIntervalMs, onFailOpen: opts.onFailOpen, warn,
  };
}

/**
 * What has gone unsaid about one decision endpoint being unreachable: one warning per
 * `warnIntervalMs` at most, with how many requests went through (or were refused) meanwhile.
 * Kept per endpoint URL, so `check()` called afresh for every request warns as seldom as one
 * middleware does.
 */
const unreachable = new Map();

/** Record that the limiter at `o.url` could not be reached, and warn when it is time. */
function failed(o, error, req) {
  const allowed = o.onError === 'allow';
  let s = unreachable.get(o.url);
  if (!s) {
    s = { last: -Infinity, let: 0, refused: 0 };
    unreachable.set(o.url, s);
  }
  if (allowed) s.let += 1;
  else s.refused += 1;
  const now = Date.now();
  if (now - s.last >= o.warnIntervalMs) {
    const what = allowed
      ? `${s.let} request(s) let through unchecked (onError: "allow")`
      : `${s.refused} request(s) answered 503 (onError: "deny")`;
    try {
      o.warn(`fleet-limiter: the limiter at ${o.url} cannot be reached (${error.message}); ${what} since the last warning`);
    } catch { /* a logger that throws must not decide the request */ }
    s.last = now;
    s.let = 0;
    s.refused = 0;
  }
  if (allowed && o.onFailOpen) {
    try {
      o.onFailOpen(error, req);
    } catch { /* a hook that throws must not decide the request */ }
  }
}

/**
 * Ask whether one request may pass.
 * @param {object} opts `{ url, timeoutMs = 250, onError = 'allow', fetch }`
 * @param {object} req `{ method, url, ip, headers }`: `url` is the path and query the function
 *   routes on, percent-encoded; header names lower-case
 * @returns {Promise<{allowed: boolean, status: number, headers: Record<string,string>, body: string, error?: Error}>}
 */
async function check(opts, req) {
  const o = options(opts);
  return ask(o, req);
}

async function ask(o, req) {
  const target = String(req.url || '/');
  // Asked about anything else, fetch would throw or the limiter refuse; a throw must not
  // become `onError: 'allow'`.
  if (!SENDABLE.test(target)) return unsendable();
  const headers = {
    'x-forwarded-method': String(req.method || 'GET'),
    'x-forwarded-uri': target,
  };
  if (req.ip) headers['x-forwarded-for'] = String(req.ip);
  for (const name of o.passed) {
    const v = req.headers && req.headers[name];
    if (typeof v === 'string') headers[name] = v;
    else if (Array.isArray(v)) headers[name] = v.join(name === 'cookie' ? '; ' : ', ');
  }
  // The app already routes the request as another method (method-override ran before this):
  // the limiter meters that method too, or refuses the override, as for one it can see.
  const routed = req.routedMethod && String(req.routedMethod);
  if (routed && routed !== headers['x-forwarded-method']) {
    const named = headers['x-http-method-override'];
    headers['x-http-method-override'] = named ? `${named}, ${routed}` : routed;
  }
  try {
    const res = await o.fetch(o.url, {
      method: 'GET',
      headers,
      signal: AbortSignal.timeout(o.timeoutMs),
    });
    const out = {};
    for (const name of LIMIT_HEADERS) {
      const v = res.headers.get(name);
      if (v !== null) out[name] = v;
    }
    const body = await res.text();
    // 501 is the limiter's answer for a method it does not let through, not a failure. 503
    // `store-unavailable` is its answer too: its store cannot answer and the limiter is set to
    // refuse meanwhile (`on_store_error = "deny"`), so the client is told the server failed and
    // when to come back (a Retry-After of its own); `onError` is for a limiter that cannot be
    // reached, and never lets such a request through.
    const unsupported = res.status === 501 && body.includes('urn:fleet-limiter:problem:unsupported-method');
    const storeDown = res.status === 503 && body.includes('urn:fleet-limiter:problem:store-unavailable');
    if (res.status >= 500 && !unsupported && !storeDown) throw new Error(`the limiter answered ${res.status}`);
    if (res.status === 403 && body.includes('not-an-allowed-proxy')) {
      throw new Error('this address is not in the limiter\'s decision.allow_from');
    }
    if (res.status === 404) throw new Error('the url does not point at a decision endpoint');
    const allowed = res.status >= 200 && res.status < 300;
    return { allowed, status: res.status, headers: out, body };
  } catch (error) {
    const allowed = o.onError === 'allow';
    failed(o, error, req);
    return {
      allowed,
      status: allowed ? 200 : 503,
      headers: allowed ? {} : { 'retry-after': '1' },
      body: allowed ? '' : JSON.stringify(UNREACHABLE),
      error,
    };
  }
}

/**
 * The path and query Express routes `req` on from here: its router matches the pathname
 * `parseurl` makes of `req.url` (below a mount point, `req.url` is what is left after
 * `req.baseUrl`). Not `req.originalUrl`, which is the target as sent: `/a#/../b` is routed as
 * `/a`, `http://host/a` as `/a`, and a middleware before this one may have rewritten `req.url`.
 * `null` when there is no path to route on.
 */
function routedTarget(req) {
  let parsed;
  try {
    parsed = parseurl(req);
  } catch {
    return null;
  }
  if (!parsed || typeof parsed.pathname !== 'string') return null;
  const base = typeof req.baseUrl === 'string' ? req.baseUrl : '';
  return base + parsed.pathname + (parsed.search || '');
}

/**
 * Express middleware: `app.use(fleetLimiter({ url: 'http://127.0.0.1:7392' }))`.
 * Allowed requests get the RateLimit headers and go on; refused ones get the limiter's answer
 * (429 for a spent budget, 503 while its store cannot answer and the limiter refuses
 * meanwhile, or 400 for a path it will not meter as Express routes it) and never reach a route.
 * The client address sent is `req.ip`, the address Express computed under the app's own
 * `trust proxy` setting: left unset (the default) for an app clients reach directly, it is the
 * connection's peer and cannot be forged; behind one proxy that appends to X-Forwarded-For, set
 * it to 1 (README.md says what goes wrong otherwise).
 */
function fleetLimiter(opts) {
  const o = options(opts);
  // The rate-limited warning (and onFailOpen) already said it; this is for callers of their own.
  const onLimiterError = opts.onLimiterError ?? (() => {});
  return async function fleetLimiterMiddleware(req, res, next) {
    let answer;
    try {
      const target = routedTarget(req);
      answer = target === null ? unsendable() : await ask(o, {
        // The method the request came with (method-override keeps it in req.originalMethod),
        // and the one Express routes on, if another.
        method: req.originalMethod || req.method,
        routedMethod: req.method,
        url: target,
        ip: req.ip,
        headers: req.headers,
      });
    } catch (error) {
      return next(error);
    }
    if (answer.error) onLimiterError(answer.error);
    for (const [k, v] of Object.entries(answer.headers)) {
      if (k !== 'retry-after' || !answer.allowed) res.setHeader(k, v);
    }
    if (answer.allowed) return next();
    res.status(answer.status);
    res.setHeader('content-type', 'application/problem+json');
    return res.send(answer.body);
  };
}

module.exports = { fleetLimiter, check };
