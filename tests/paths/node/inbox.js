// The Express 5 app of tests/body_keys.rs: an auth service behind the gateway, with Express's
// stock body parsers (`express.json()`, `express.urlencoded()`, both of which inflate gzip and
// deflate bodies and skip a byte-order mark), reading `req.body.email` as a handler would.
//
//   node inbox.js
//
// - POST /auth/forgot-password "sends" a mail to what `req.body.email` names, delivered as a
//   generous mail system would: a string or every element of an array; each split on `,` and
//   `;`; a display form's `<addr>` taken; NFKC, zero-width and other format characters dropped,
//   lower case, a quoted local part unquoted, a `+tag` dropped, the domain in its ASCII form.
//   It answers 200 and counts one mail per inbox.
// - POST /auth/login answers 200 when `password` is "right", else 401; it counts every attempt
//   it sees per account (the same delivery rules name the account).
// - GET /__count?inbox=<addr> answers {"mails": n, "attempts": n} for that inbox.
//
// It prints `listening <port>` once it listens on 127.0.0.1.
'use strict';

const express = require('express');
const { domainToASCII } = require('node:url');

const mails = new Map();
const attempts = new Map();

function inboxes(value) {
  const out = [];
  const values = Array.isArray(value) ? value : [value];
  for (const v of values) {
    if (typeof v !== 'string' && typeof v !== 'number') continue;
    for (let part of String(v).split(/[,;]/)) {
      const angle = part.match(/<([^>]*)>/);
      if (angle) part = angle[1];
      part = part.normalize('NFKC').replace(/\p{Cf}/gu, '').trim().toLowerCase();
      const at = part.lastIndexOf('@');
      if (at <= 0) continue;
      let local = part.slice(0, at);
      const domain = domainToASCII(part.slice(at + 1).replace(/\.+$/, ''));
      if (!domain) continue;
      if (local.startsWith('"') && local.endsWith('"')) local = local.slice(1, -1).replace(/\\(.)/g, '$1');
      local = local.split('+')[0] || local;
      out.push(`${local}@${domain}`);
    }
  }
  return out;
}

function bump(map, key) {
  map.set(key, (map.get(key) || 0) + 1);
}

const app = express();
app.use(express.json());
app.use(express.urlencoded());

app.post('/auth/forgot-password', (req, res) => {
  for (const inbox of inboxes(req.body && req.body.email)) bump(mails, inbox);
  res.json({ ok: true });
});

app.post('/auth/login', (req, res) => {
  for (const inbox of inboxes(req.body && req.body.email)) bump(attempts, inbox);
  const right = req.body && req.body.password === 'right';
  res.status(right ? 200 : 401).json({ ok: right });
});

app.get('/__count', (req, res) => {
  const inbox = String(req.query.inbox || '');
  res.json({ mails: mails.get(inbox) || 0, attempts: attempts.get(inbox) || 0 });
});

// A body the parsers refuse is the app's 400, as Express answers it.
app.use((err, req, res, _next) => {
  res.status(err.status || 400).json({ error: err.type || 'bad body' });
});

const server = app.listen(0, '127.0.0.1', () => {
  console.log(`listening ${server.address().port}`);
});
