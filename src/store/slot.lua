-- fleet-limiter: decide the checks of one request that share a Redis Cluster slot.
--
-- KEYS[i]    one bucket per check, in request order
-- ARGV[1..3] as prelude.lua says; ARGV[4..] five per check, as decide() in gcra.lua says
--
-- Returns { committed, then four integers per check, then two strings per check: the value
-- before and the value written }; the strings let the caller undo a consumption that a
-- different slot's refusal cancelled (refund.lua).

local blocked, verdicts, before, written = decide(0, #KEYS, 3)
local out = { blocked and 0 or 1 }
for i = 1, #verdicts do
  out[#out + 1] = verdicts[i]
end
for i = 1, #KEYS do
  out[#out + 1] = before[i]
  out[#out + 1] = written[i] or ''
end
return out
