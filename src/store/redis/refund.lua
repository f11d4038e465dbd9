-- fleet-limiter: give back what decide.lua consumed, in one of two cases.
--
-- 1. ARGV[4] == "answer": requests whose answers say they should not have counted (a limiter with
--    count = "failed" or "succeeded"), several buckets in one call (one slot's on a Cluster).
--    KEYS[i]      a bucket
--    ARGV[1..3]   as below
--    ARGV[4 + 4(i-1) + 1..4] for KEYS[i]: algorithm ("g" or "f"), emission interval (gcra) or
--                 window (fixed window) in ns, units consumed, and what was left of the
--                 decision's reset_after when the answer came (ns).
--    GCRA moves the arrival time back by the units, never by more than that remainder and never
--    before now; a fixed window counts them back only in the window that counted them (its end
--    within half a window of where the decision put it). Mirrors limiter::give_back_answered.
--    Returns how many buckets changed.
--
-- 2. Otherwise: a check on a different Redis Cluster slot refused the same request.
--
-- KEYS[1]    the bucket
-- ARGV[1..2] now as seconds and nanoseconds, or "" "" to read Redis TIME
-- ARGV[3]    milliseconds added to every expiry (0 in production)
-- ARGV[4]    the value decide.lua wrote
-- ARGV[5]    the value before it ("" when the bucket was missing)
-- ARGV[6]    algorithm ("g" or "f"), ARGV[7] emission interval (gcra) in ns, ARGV[8] units consumed
--
-- If nothing touched the bucket since, the old value comes back exactly. Otherwise a later request
-- built on our write: GCRA moves the arrival time back by the units consumed, and a fixed window
-- that is still the same window counts them back.

-- now_s, now_n, pad_ms, NS and idiv come from prelude.lua.

if ARGV[4] == 'answer' then
  local changed = 0
  for i = 1, #KEYS do
    local base = 4 + (i - 1) * 4
    local algo = ARGV[base + 1]
    local p = tonumber(ARGV[base + 2])
    local units = tonumber(ARGV[base + 3])
    local left = tonumber(ARGV[base + 4])
    local cur = redis.call('GET', KEYS[i])
    local s, n, b
    if cur then
      s, n, b = string.match(cur, '^(%d+) (%d+) (%d+)$')
    end
    if s and left > 0 and units > 0 then
      local rel = (tonumber(s) - now_s) * NS + (tonumber(n) - now_n)
      local value
      if algo == 'g' and rel > 0 then
        local back = units * p
        if back > left then
          back = left
        end
        local moved = rel - back
        if moved < 0 then
          moved = 0
        end
        local total = now_n + moved
        local carry = idiv(total, NS)
        value = string.format('%d %d %s', now_s + carry, total - carry * NS, b)
      elseif algo == 'f' and rel > 0 and math.abs(rel - left) < p / 2 and tonumber(b) > 0 then
        local count = tonumber(b) - units
        if count < 0 then
          count = 0
        end
        value = string.format('%s %s %d', s, n, count)
      end
      if value then
        redis.call('SET', KEYS[i], value, 'KEEPTTL')
        changed = changed + 1
      end
    end
  end
  return changed
end

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
