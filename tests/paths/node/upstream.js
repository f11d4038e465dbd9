// The Node upstreams of the path differential test (tests/paths.rs), one per process:
//
//   node upstream.js express <hits-file>   Express 5 with its default routing
//                                          (case-insensitive, non-strict trailing slash)
//   node upstream.js whatwg <hits-file>    plain `http`, routing on
//                                          new URL(req.url, 'http://upstream.test').pathname
//   node upstream.js express-client <hits-file> <decision-url>
//                                          the Express 5 app with fleet-limiter's Express
//                                          client (clients/express) in front of its routes,
//                                          asking the decision endpoint at <decision-url>
//
// All serve the routes in ../routes.json, first match wins: 200 with `X-Route: <id>`, or 404
// with `X-Route: none`. Every request that reaches a route (or the 404 or error handler)
// appends one line to the hits file, `<method> <req.url as JSON> <route>`, before it is
// answered (a request Node's parser refuses: `? "<error code>" none`, except with the client in
// front, where Node's parser is the front and its refusal reaches no route); `GET /__barrier`
// is answered and logged too, without asking the limiter, so the test knows every earlier line
// is written. The server listens on a free loopback port and prints `listening <port>` once it
// does.
'use strict';

const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');

const [kind, hitsFile, decisionUrl] = process.argv.slice(2);
const routes = JSON.parse(fs.readFileSync(path.join(__dirname, '..', 'routes.json'), 'utf8'));

function hit(req, route) {
  fs.appendFileSync(hitsFile, `${req.method} ${JSON.stringify(req.url)} ${route}\n`);
}

function answer(req, res, route, status) {
  hit(req, route);
  res.statusCode = status;
  res.setHeader('X-Route', route);
  res.setHeader('Content-Type', 'text/plain');
  res.end(`${route}\n`);
}

function methodAdmits(routeMethod, method) {
  return routeMethod === null || routeMethod === method || (routeMethod === 'GET' && method === 'HEAD');
}

function expressApp(limiter) {
  const express = require('express');
  const app = express();
  app.get('/__barrier', (req, res) => answer(req, res, 'barrier', 200));
  if (limiter) {
    app.use(limiter);
  }
  for (const r of routes) {
    const verb = r.method === null ? 'all' : r.method.toLowerCase();
    const pattern = r.prefix ? `${r.path}{/*rest}` : r.path;
    app[verb](pattern, (req, res) => answer(req, res, r.id, 200));
  }
  app.use((req, res) => answer(req, res, 'none', 404));
  // Express refuses some paths itself (e.g. a parameter that does not percent-decode): that is
  // no route served either.
  app.use((err, req, res, _next) => answer(req, res, 'none', err.status || err.statusCode || 500));
  return app;
}

function whatwgHandler(req, res) {
  let pathname;
  try {
    pathname = new URL(req.url, 'http://upstream.test').pathname;
  } catch {
    return answer(req, res, 'none', 400);
  }
  let p = pathname.toLowerCase();
  if (p.length > 1 && p.endsWith('/')) {
    p = p.slice(0, -1);
  }
  if (req.method === 'GET' && p === '/__barrier') {
    return answer(req, res, 'barrier', 200);
  }
  for (const r of routes) {
    const base = r.path.toLowerCase();
    const inPath = p === base || (r.prefix && p.startsWith(`${base}/`));
    if (inPath && methodAdmits(r.method, req.method)) {
      return answer(req, res, r.id, 200);
    }
  }
  return answer(req, res, 'none', 404);
}

function clientApp() {
  const { fleetLimiter } = require(path.join(__dirname, '..', '..', '..', 'clients', 'express'));
  // A limiter that cannot be reached denies (503): nothing passes unasked.
  return expressApp(fleetLimiter({
    url: decisionUrl,
    timeoutMs: 10_000,
    onError: 'deny',
    onLimiterError: (e) => console.error(`fleet-limiter: ${e.message}`),
  }));
}

const handler = kind === 'express' ? expressApp()
  : kind === 'whatwg' ? whatwgHandler
  : kind === 'express-client' && decisionUrl ? clientApp()
  : null;
if (handler === null || !hitsFile) {
  console.error('usage: node upstream.js express|whatwg <hits-file>, or express-client <hits-file> <decision-url>');
  process.exit(2);
}
fs.writeFileSync(hitsFile, '');
const server = http.createServer(handler);
// Node's own HTTP parser refuses some requests before any router sees them (e.g. a lower-case
// method): that request reached the upstream and was served no route. A connection merely
// reset or timed out is no request.
server.on('clientError', (err, socket) => {
  if (kind !== 'express-client' && typeof err.code === 'string' && err.code.startsWith('HPE_')) {
    fs.appendFileSync(hitsFile, `? ${JSON.stringify(err.code)} none\n`);
  }
  if (socket.writable) {
    socket.end('HTTP/1.1 400 Bad Request\r\nX-Route: none\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
  } else {
    socket.destroy();
  }
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  console.log(`listening ${server.address().port}`);
});
