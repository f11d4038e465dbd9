-- fleet-limiter: the decision every entry script (slot.lua, batch.lua) runs; prelude.lua, this
-- file and the entry are joined at compile time.
--
-- Mirrors src/limiter/gcra.rs and src/limiter/fixed_window.rs line for line, and
-- MemoryStore::decide_many: when every enforcing check of a request allows, each allowed check
-- consumes; when an enforcing check refuses, the request consumes nothing.
--
-- Lua numbers are doubles, exact only up to 2^53, while nanoseconds since the epoch need 61 bits.
-- So a stored instant is two integers, "<seconds> <nanoseconds> <count>", and all arithmetic is
-- done on offsets from now (exact for anything within 104 days; the store refuses longer windows).
--
-- A call reads every bucket it names once (read), decides its requests one after the other
-- against what the earlier ones left (decide), then writes each bucket that changed once (write).
-- The script is atomic, so this is exactly the same as deciding and writing request by request,
-- with one MGET instead of a GET per check.

-- now_s, now_n, pad_ms, NS and idiv come from prelude.lua; load_lock, is_lock, locked_for and
-- lock_state from lockout.lua.

-- Arguments per check (see decide).
local CHECK_ARGS = 7

-- Per bucket name: the state as the call's requests left it ({ offset of `a` from now in ns,
-- count }, or false when missing), the stored value before the call ("" when missing), and
-- whether a request changed it.
local state, raw, dirty, order = {}, {}, {}, {}

-- stored string -> { offset of `a` from now (ns), count }, or { offset of the lock's end, 0,
-- true } for a lock (lockout.lua); false for a missing or unreadable value
local function load(value)
  if not value then
    return false
  end
  local s, n, b = string.match(value, '^(%d+) (%d+) (%d+)$')
  if not s then
    return load_lock(value)
  end
  return { (tonumber(s) - now_s) * NS + (tonumber(n) - now_n), tonumber(b) }
end

-- Read every bucket the call names (KEYS) with one MGET.
local function read()
  local n = #KEYS
  if n == 0 then
    return
  end
  local values = redis.call('MGET', unpack(KEYS))
  for i = 1, n do
    local key = KEYS[i]
    if raw[key] == nil then
      raw[key] = values[i] or ''
      state[key] = load(values[i])
    end
  end
end

-- The parameters repeat from request to request of one call: convert each string once.
local numbers = {}
local function num(s)
  local v = numbers[s]
  if v == nil then
    v = tonumber(s)
    numbers[s] = v
  end
  return v
end

-- decide(kb, n, ab): one request, whose buckets are KEYS[kb + 1 .. kb + n] (in request order; the
-- same key may appear twice, the later check seeing the earlier one's update) and whose
-- parameters are seven per check from ARGV[ab + 1 ..]: algorithm ("g" gcra, "f" fixed window),
-- limit, emission interval (gcra) or window (fixed window) in ns, burst in ns (gcra), shadow
-- ("1" or "0"), units the request costs (at least 1), lockout in ns (0 for none). Returns
-- blocked, and four integers per check: allowed, remaining, reset_after_ns, retry_after_ns.
local function decide(kb, n, ab)
  local verdicts = {}
  local pending = {}
  local locks = {}
  local blocked = false

  for i = 1, n do
    local key = KEYS[kb + i]
    local base = ab + (i - 1) * CHECK_ARGS
    local algo = ARGV[base + 1]
    local limit = num(ARGV[base + 2])
    local p = num(ARGV[base + 3])
    local burst = num(ARGV[base + 4])
    local shadow = ARGV[base + 5] == '1'
    local units = num(ARGV[base + 6])
    local lockout = num(ARGV[base + 7])

    local st = pending[key]
    if st == nil then
      st = state[key]
    end

    local allowed, remaining, reset_after, retry_after, new
    local lock_left = locked_for(st)
    if lock_left then
      allowed, remaining, reset_after, retry_after = 0, 0, lock_left, lock_left
    elseif is_lock(st) then
      st = false
    end
    if lock_left then
      -- decided above: refused for what is left of the lock, which is not renewed
    elseif algo == 'g' then
      local t = p
      local tat = 0
      if st and st[1] > 0 then
        tat = st[1]
      end
      local used = tat + units * t
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
      if count + units > limit then
        allowed, remaining, reset_after, retry_after = 0, 0, ends, ends
      else
        count = count + units
        allowed, remaining, reset_after, retry_after = 1, limit - count, ends, 0
        new = { ends, count }
      end
    end

    if allowed == 0 and not lock_left and lockout > 0 then
      -- The first refusal locks the key: the wait is the whole lockout.
      reset_after, retry_after = lockout, lockout
      new = lock_state(lockout)
      locks[key] = new
    end
    if new then
      pending[key] = new
    end
    if allowed == 0 and not shadow then
      blocked = true
    end
    verdicts[#verdicts + 1] = allowed
    verdicts[#verdicts + 1] = remaining
    verdicts[#verdicts + 1] = reset_after
    verdicts[#verdicts + 1] = retry_after
  end

  -- A refused request consumes nothing, but a lock its refusal started is kept.
  local commit = pending
  if blocked then
    commit = locks
  end
  for key, st in pairs(commit) do
    state[key] = st
    if not dirty[key] then
      dirty[key] = true
      order[#order + 1] = key
    end
  end
  return blocked, verdicts
end

-- Write every bucket a request changed: an absolute instant again, expiring once its bucket is
-- full. Returns the values written, by bucket name.
local function write()
  local written = {}
  for _, key in ipairs(order) do
    local rel = state[key][1]
    local total = now_n + rel
    local carry = idiv(total, NS)
    local value
    if is_lock(state[key]) then
      value = string.format('%d %d L', now_s + carry, total - carry * NS)
    else
      value = string.format('%d %d %d', now_s + carry, total - carry * NS, state[key][2])
    end
    local px = math.floor(rel / 1000000) + 1
    while px * 1000000 < rel do
      px = px + 1
    end
    redis.call('SET', key, value, 'PX', px + pad_ms)
    written[key] = value
  end
  return written
end
