-- fleet-limiter: locks, for limiters with a lockout (joined at compile time between prelude.lua
-- and decide.lua). Mirrors State::Locked in src/limiter/mod.rs.
--
-- Once a limiter with a lockout refuses a key, the key's bucket is replaced by a lock,
-- "<seconds> <nanoseconds> L": the instant the lock ends, stored (like every bucket) with an
-- expiry at that instant, so it survives a restart of the gateway and goes by itself. While it
-- holds, every request of the key is refused with what is left of it as the wait, and a refusal
-- does not renew it; after it, the key is missing (a full bucket). refund.lua never matches a
-- lock, so nothing is given back to one.

-- now_s, now_n and NS come from prelude.lua.

-- stored string -> { offset of the lock's end from now (ns), 0, true }; false when unreadable
local function load_lock(value)
  local s, n = string.match(value, '^(%d+) (%d+) L$')
  if not s then
    return false
  end
  return { (tonumber(s) - now_s) * NS + (tonumber(n) - now_n), 0, true }
end

-- whether a loaded state is a lock
local function is_lock(st)
  return st and st[3] == true
end

-- ns left of a lock that still holds; nil for anything else
local function locked_for(st)
  if is_lock(st) and st[1] > 0 then
    return st[1]
  end
  return nil
end

-- the state of a lock starting now for `lockout` ns
local function lock_state(lockout)
  return { lockout, 0, true }
end

