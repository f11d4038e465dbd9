-- fleet-limiter: the lines every script of the Redis store starts with (prepended at compile
-- time to each script: decide.lua with slot.lua or batch.lua, and refund.lua).
--
-- ARGV[1..2] now as seconds and nanoseconds, or "" "" to read Redis TIME
-- ARGV[3]    milliseconds added to every expiry (0 in production)

local now_s, now_n
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_s = tonumber(t[1])
  now_n = tonumber(t[2]) * 1000
else
  now_s = tonumber(ARGV[1])
  now_n = tonumber(ARGV[2])
end
local pad_ms = tonumber(ARGV[3])
local NS = 1000000000

-- floor(x / y) for non-negative integers below 2^53, exact despite float division
local function idiv(x, y)
  local q = math.floor(x / y)
  if q * y > x then
    q = q - 1
  elseif (q + 1) * y <= x then
    q = q + 1
  end
  return q
end

