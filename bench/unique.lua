-- POST /api/agent/heartbeat, each request from a new agent id, and stop after BENCH_KEYS
-- requests per thread: fills a store with that many distinct buckets.
local limit = tonumber(os.getenv("BENCH_KEYS") or "1000000")
local body = '{"status":"healthy","uptime":3600}'
local n = 0
local sent = 0
local prefix = "u"

function setup(thread)
  thread:set("prefix", "u" .. tostring(math.random(0, 1e9)))
end

function init(args)
  prefix = tostring(prefix)
end

function request()
  -- Never more than `limit` distinct agents, however long wrk runs.
  n = n % limit + 1
  return wrk.format("POST", "/api/agent/heartbeat", {
    ["X-Agent-ID"] = prefix .. "-" .. n,
    ["Content-Type"] = "application/json",
  }, body)
end

function response(status, headers, body)
  sent = sent + 1
  if sent >= limit then
    wrk.thread:stop()
  end
end
