// A serverless function as a CommonJS module: the web-standard `Request` -> `Response` handler
// (Vercel and Netlify functions, or any Node 18+ server that makes one), asking
// fleet-limiter's decision endpoint (FLEET_LIMITER_URL, e.g. http://10.0.0.9:7392) before it
// answers. The ES module twin is serverless.mjs.
'use strict';

const { check } = require('@fleet-limiter/express');

/**
 * The client's address, as the one proxy in front of the function (the platform's edge) saw
 * it: the last entry of X-Forwarded-For, which that proxy appended. Entries before it are
 * whatever the client sent and are never believed. Behind two proxies that each append, take
 * the second to last, and so on; a function reachable with no proxy in front cannot learn its
 * client's address from a header at all (leave it out: the limiter then keys on the address
 * that asked it, one budget for every client, which no client can escape).
 */
function clientAddress(request) {
  const hops = (request.headers.get('x-forwarded-for') || '').split(',');
  return hops[hops.length - 1].trim() || undefined;
}

async function handler(request) {
  // The path and query the function routes on: the WHATWG parser has already resolved dot
  // segments, so what is asked about is what is routed.
  const url = new URL(request.url);
  const decision = await check({ url: process.env.FLEET_LIMITER_URL }, {
    method: request.method,
    url: url.pathname + url.search,
    ip: clientAddress(request),
    headers: Object.fromEntries(request.headers),
  });
  if (!decision.allowed) {
    return new Response(decision.body, {
      status: decision.status,
      headers: { ...decision.headers, 'content-type': 'application/problem+json' },
    });
  }
  // The function's own work; the limit headers go on its answer too.
  return new Response(JSON.stringify({ served: url.pathname }), {
    status: 200,
    headers: { ...decision.headers, 'content-type': 'application/json' },
  });
}

module.exports = { handler, clientAddress };
