-- fleet-limiter: decide the checks of one request that share a Redis Cluster slot.
--
-- KEYS[i]    one bucket per check, in request order
-- ARGV[1..3] as prelude.lua says; ARGV[4..] seven per check, as decide() in decide.lua says
--
-- Returns { committed, then four integers per check, then two strings per check: the bucket's
-- value before the request, and the value written (at the last check that consumed from that
-- bucket, unless the request left it locked; "" elsewhere) }; the strings let the caller undo a consumption that a different
-- slot's refusal cancelled (refund.lua).

read()
local blocked, verdicts = decide(0, #KEYS, 3)
local written = write()
local out = { blocked and 0 or 1 }
for i = 1, #verdicts do
  out[#out + 1] = verdicts[i]
end
local last = {}
for i = 1, #KEYS do
  if verdicts[4 * (i - 1) + 1] == 1 then
    last[KEYS[i]] = i
  end
end
for i = 1, #KEYS do
  local key = KEYS[i]
  out[#out + 1] = raw[key]
  -- A bucket a later check of the request locked has nothing to refund: the lock stays.
  if last[key] == i and written[key] and not is_lock(state[key]) then
    out[#out + 1] = written[key]
  else
    out[#out + 1] = ''
  end
end
return out
