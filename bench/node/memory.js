// Bytes per tracked key in express-rate-limit's MemoryStore: heap and RSS before and after one
// hit for each of N distinct ip+agent keys.   node --expose-gc memory.js 1000000
'use strict';
const { MemoryStore } = require('express-rate-limit');

async function main() {
  const n = Number(process.argv[2] || 1000000);
  const store = new MemoryStore();
  store.init({ windowMs: 60 * 1000 });
  global.gc();
  const before = process.memoryUsage();
  for (let i = 0; i < n; i++) {
    await store.increment(`10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}:agent-${i}`);
  }
  global.gc();
  const after = process.memoryUsage();
  const heap = (after.heapUsed - before.heapUsed) / n;
  const rss = (after.rss - before.rss) / n;
  console.log(
    `express-rate-limit MemoryStore: ${n} keys, heap +${((after.heapUsed - before.heapUsed) / 1048576).toFixed(1)} MiB ` +
      `(${heap.toFixed(1)} bytes per key), RSS ${rss.toFixed(1)} bytes per key`,
  );
  store.shutdown();
}
main();
