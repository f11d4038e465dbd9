-- fleet-limiter: decide several requests on a standalone server, one after the other, each
-- atomically and exactly as if it had come alone (a later request sees what an earlier one
-- consumed).
--
-- KEYS       every request's buckets, request after request
-- ARGV[1..3] as prelude.lua says
-- ARGV[4..]  per request: its number of checks n, then seven per check, as decide() in decide.lua
--            says
--
-- Returns, per request: committed, then four integers per check.

read()
local out = {}
local kb, ab = 0, 4
while ab <= #ARGV do
  local n = tonumber(ARGV[ab])
  local blocked, verdicts = decide(kb, n, ab)
  out[#out + 1] = blocked and 0 or 1
  for i = 1, #verdicts do
    out[#out + 1] = verdicts[i]
  end
  kb = kb + n
  ab = ab + 1 + CHECK_ARGS * n
end
write()
return out
