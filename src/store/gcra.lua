-- fleet-limiter: decide every check of one request atomically (a function both entry scripts,
-- slot.lua and batch.lua, call; prelude.lua, this file and the entry are joined at compile time).
--
-- Mirrors src/limiter/gcra.rs and src/limiter/fixed_window.rs line for line, and
-- MemoryStore::decide_many: when every enforcing check allows, each allowed check consumes;
-- when an enforcing check refuses, nothing is written.
--
-- Lua numbers are doubles, exact only up to 2^53, while nanoseconds since the epoch need 61 bits.
-- So a stored instant is two integers, "<seconds> <nanoseconds> <count>", and all arithmetic is
-- done on offsets from now (exact for anything within 104 days; the store refuses longer windows).
--
-- decide(kb, n, ab) reads the request's buckets from KEYS[kb + 1 .. kb + n] (in request order; the
-- same key may appear twice) and five parameters per check from ARGV[ab + 1 ..]: algorithm ("g"
-- gcra, "f" fixed window), limit, emission interval (gcra) or window (fixed window) in ns, burst
-- in ns (gcra), advisory ("1" or "0"). It writes what the request consumed and returns
-- blocked, verdicts (four integers per check: allowed, remaining, reset_after_ns,
-- retry_after_ns), before and written (per check, the value before and the value written, ""
-- when none).

-- now_s, now_n, pad_ms, NS and idiv come from prelude.lua.

-- stored string -> offset of `a` from now (ns), count; nil for a missing or unreadable value
local function load(raw)
  if not raw then
    return nil
  end
  local s, n, b = string.match(raw, '^(%d+) (%d+) (%d+)$')
  if not s then
    return nil
  end
  return { (tonumber(s) - now_s) * NS + (tonumber(n) - now_n), tonumber(b) }
end

local function decide(kb, n, ab)
  local verdicts = {}
  local updates = {}
  local before = {}
  local pending = {}
  local blocked = false

  for i = 1, n do
    local key = KEYS[kb + i]
    local base = ab + (i - 1) * 5
    local algo = ARGV[base + 1]
    local limit = tonumber(ARGV[base + 2])
    local p = tonumber(ARGV[base + 3])
    local burst = tonumber(ARGV[base + 4])
    local advisory = ARGV[base + 5] == '1'

    -- A request may name the same bucket twice: the later check sees the earlier update.
    local st = pending[key]
    if st == nil then
      local raw = redis.call('GET', key)
      before[i] = raw or ''
      st = load(raw)
    else
      before[i] = ''
    end

    local allowed, remaining, reset_after, retry_after, new
    if algo == 'g' then
      local t = p
      local tat = 0
      if st and st[1] > 0 then
        tat = st[1]
      end
      local used = tat + t
      if used > burst then
        allowed, remaining, reset_after, retry_after = 0, 0, tat, used - burst
      else
        remaining = idiv(burst - used, t)
        if remaining > limit then
          remaining = limit
        end
        allowed, reset_after, retry_after = 1, used, 0
        new = { used, 0 }
      end
    else
      local window = p
      local ends, count = window, 0
      if st and st[1] > 0 then
        ends, count = st[1], st[2]
      end
      if count >= limit then
        allowed, remaining, reset_after, retry_after = 0, 0, ends, ends
      else
        count = count + 1
        allowed, remaining, reset_after, retry_after = 1, limit - count, ends, 0
        new = { ends, count }
      end
    end

    if new then
      pending[key] = new
    end
    updates[i] = new or false
    if allowed == 0 and not advisory then
      blocked = true
    end
    verdicts[#verdicts + 1] = allowed
    verdicts[#verdicts + 1] = remaining
    verdicts[#verdicts + 1] = reset_after
    verdicts[#verdicts + 1] = retry_after
  end

  -- Write each key's last update: an absolute instant again, expiring once its bucket is full.
  local written = {}
  if not blocked then
    local last = {}
    for i = 1, n do
      if updates[i] then
        last[KEYS[kb + i]] = i
      end
    end
    for i = 1, n do
      if updates[i] and last[KEYS[kb + i]] == i then
        local rel = updates[i][1]
        local total = now_n + rel
        local carry = idiv(total, NS)
        local value = string.format('%d %d %d', now_s + carry, total - carry * NS, updates[i][2])
        local px = math.floor(rel / 1000000) + 1
        while px * 1000000 < rel do
          px = px + 1
        end
        redis.call('SET', KEYS[kb + i], value, 'PX', px + pad_ms)
        written[i] = value
      end
    end
  end
  return blocked, verdicts, before, written
end
