-- fleet-limiter: what slot.lua would answer for one bucket, writing nothing (an operator's
-- `explain`).
--
-- KEYS[1]    the bucket
-- ARGV[1..3] as prelude.lua says; ARGV[4..10] the check, as decide() in decide.lua says
--
-- Returns the check's four integers: allowed, remaining, reset_after_ns, retry_after_ns.

read()
local _, verdicts = decide(0, #KEYS, 3)
return verdicts
