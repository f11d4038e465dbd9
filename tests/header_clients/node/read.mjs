// Asks URL COUNT times as agent AGENT and prints one JSON line per answer: its status, its
// headers, what ratelimit-header-parser read from it (the reset in milliseconds since the
// epoch; NaN and a missing value print as null) and when it was read.
//
//   node read.mjs URL AGENT COUNT
import { parseRateLimit } from 'ratelimit-header-parser';

const [url, agent, count] = process.argv.slice(2);
for (let i = 0; i < Number(count); i++) {
  const res = await fetch(url, { headers: { 'x-agent-id': agent } });
  const parsed = parseRateLimit(res);
  const now = Date.now();
  const headers = Object.fromEntries(res.headers);
  await res.arrayBuffer();
  const read = parsed && {
    limit: parsed.limit,
    remaining: parsed.remaining,
    reset: parsed.reset ? parsed.reset.getTime() : null,
  };
  console.log(JSON.stringify({ status: res.status, headers, now, parsed: read ?? null }));
}
