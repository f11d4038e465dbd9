// The Express 5 app of the method-override tests (tests/methods.rs): the stock
// `method-override` middleware, mounted as its README shows, once per override it reads:
//
//   X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override (headers) and `_method` (query),
//
// each for a request of ANY method (`methods: null`), which overrides more requests than the
// default (POST only) and so makes a harder test. It serves the routes in ../routes.json with
// Express's own routing, first match wins: 200 with `X-Route: <id>`, `X-Method: <req.method>`
// (the method it routed on) and `X-Original-Method`, or 404 with `X-Route: none`.
//
//   node override.js <hits-file>
//
// Every request that reaches the server appends one JSON line to the hits file before it is
// answered: {"method", "original", "url", "route", "headers"} where `headers` holds every
// request header whose name contains "method" (so a test sees what an override left behind).
// A CONNECT (Node hands it to the 'connect' event, not to Express) and a request Node's parser
// refuses are logged too, as route "none". `GET /__barrier` is answered and logged, so the test
// knows every earlier line is written. It prints `listening <port>` once it listens.
'use strict';

const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const express = require('express');
const methodOverride = require('method-override');

const [hitsFile] = process.argv.slice(2);
if (!hitsFile) {
  console.error('usage: node override.js <hits-file>');
  process.exit(2);
}
const routes = JSON.parse(fs.readFileSync(path.join(__dirname, '..', 'routes.json'), 'utf8'));

function log(fields) {
  fs.appendFileSync(hitsFile, `${JSON.stringify(fields)}\n`);
}

function methodHeaders(headers) {
  const out = {};
  for (const [k, v] of Object.entries(headers)) {
    if (k.includes('method')) out[k] = v;
  }
  return out;
}

function answer(req, res, route, status) {
  const original = req.originalMethod || req.method;
  log({ method: req.method, original, url: req.originalUrl || req.url, route, headers: methodHeaders(req.headers) });
  res.status(status);
  res.set('X-Route', route);
  res.set('X-Method', req.method);
  res.set('X-Original-Method', original);
  res.type('text/plain');
  res.send(`${route}\n`);
}

const app = express();
for (const getter of ['X-HTTP-Method-Override', 'X-HTTP-Method', 'X-Method-Override', '_method']) {
  app.use(methodOverride(getter, { methods: null }));
}
app.get('/__barrier', (req, res) => answer(req, res, 'barrier', 200));
for (const r of routes) {
  const verb = r.method === null ? 'all' : r.method.toLowerCase();
  const pattern = r.prefix ? `${r.path}{/*rest}` : r.path;
  app[verb](pattern, (req, res) => answer(req, res, r.id, 200));
}
app.use((req, res) => answer(req, res, 'none', 404));
app.use((err, req, res, _next) => answer(req, res, 'none', err.status || err.statusCode || 500));

fs.writeFileSync(hitsFile, '');
const server = http.createServer(app);
server.on('connect', (req, socket) => {
  log({ method: req.method, original: req.method, url: req.url, route: 'none', headers: methodHeaders(req.headers) });
  socket.end('HTTP/1.1 405 Method Not Allowed\r\nX-Route: none\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
});
server.on('clientError', (err, socket) => {
  if (typeof err.code === 'string' && err.code.startsWith('HPE_')) {
    log({ method: '?', original: '?', url: err.code, route: 'none', headers: {} });
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
