-- fleet-limiter: the small tables every instance reads (run-time overrides, resets).
--
-- KEYS[1]  the table (a hash), KEYS[2] its version (an integer), in one hash tag
-- ARGV[1]  "read": ARGV[2] the version the caller holds; returns { version } when it is the
--          same, else { version, field, value, field, value, ... }
--          "set": ARGV[2] the field, ARGV[3] the value; "del": ARGV[2] the field. Both bump the
--          version and return { version }.

if ARGV[1] == 'read' then
  local v = tonumber(redis.call('GET', KEYS[2]) or '0')
  if v == tonumber(ARGV[2]) then
    return { v }
  end
  local out = { v }
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all do
    out[#out + 1] = all[i]
  end
  return out
elseif ARGV[1] == 'set' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
elseif ARGV[1] == 'del' then
  redis.call('HDEL', KEYS[1], ARGV[2])
else
  return redis.error_reply('unknown table operation')
end
return { redis.call('INCR', KEYS[2]) }
