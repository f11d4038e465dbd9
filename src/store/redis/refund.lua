-- fleet-limiter: give back what gcra.lua consumed on one bucket, when a check on a different
-- Redis Cluster slot refused the same request.
--
-- KEYS[1]    the bucket
-- ARGV[1..2] now as seconds and nanoseconds, or "" "" to read Redis TIME
-- ARGV[3]    milliseconds added to every expiry (0 in production)
-- ARGV[4]    the value gcra.lua wrote
-- ARGV[5]    the value before it ("" when the bucket was missing)
-- ARGV[6]    algorithm ("g" or "f"), ARGV[7] emission interval (gcra) in ns, ARGV[8] units consumed
--
-- If nothing touched the bucket since, the old value comes back exactly. Otherwise a later request
-- built on our write: GCRA moves the arrival time back by the units consumed, and a fixed window
-- that is still the same window counts them back.

-- now_s, now_n, pad_ms, NS and idiv come from prelude.lua.

local key = KEYS[1]
local cur = redis.call('GET', key)
if cur == ARGV[4] then
  local s, n = string.match(ARGV[5], '^(%d+) (%d+) %d+$')
  if not s then
    redis.call('DEL', key)
    return 1
  end
  local rel = (tonumber(s) - now_s) * NS + (tonumber(n) - now_n)
  if rel <= 0 then
    redis.call('DEL', key)
  else
    local px = math.floor(rel / 1000000) + 1
    while px * 1000000 < rel do
      px = px + 1
    end
    redis.call('SET', key, ARGV[5], 'PX', px + pad_ms)
  end
  return 1
end
if not cur then
  return 0
end
local s, n, b = string.match(cur, '^(%d+) (%d+) (%d+)$')
if not s then
  return 0
end
local units = tonumber(ARGV[8])
if ARGV[6] == 'g' then
  local total = tonumber(n) - units * tonumber(ARGV[7])
  local carry = idiv(total, NS)
  local value = string.format('%d %d %s', tonumber(s) + carry, total - carry * NS, b)
  redis.call('SET', key, value, 'KEEPTTL')
  return 2
end
local ws, wn = string.match(ARGV[4], '^(%d+) (%d+) %d+$')
if ws == s and wn == n then
  local left = tonumber(b) - units
  if left < 0 then
    left = 0
  end
  redis.call('SET', key, string.format('%s %s %d', s, n, left), 'KEEPTTL')
  return 2
end
return 0
