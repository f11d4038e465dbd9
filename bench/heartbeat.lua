-- POST /api/agent/heartbeat from 1 000 rotating agents (X-Agent-ID agent-0000 .. agent-0999).
-- Each wrk thread starts at its own offset so threads do not walk the ids in lockstep.
local agents = tonumber(os.getenv("BENCH_AGENTS") or "1000")
local body = '{"status":"healthy","uptime":3600}'
local requests = {}
local n = 0

function setup(thread)
  thread:set("offset", math.random(0, agents - 1))
end

function init(args)
  for i = 0, agents - 1 do
    requests[i] = wrk.format("POST", "/api/agent/heartbeat", {
      ["X-Agent-ID"] = string.format("agent-%04d", i),
      ["Content-Type"] = "application/json",
    }, body)
  end
  n = tonumber(offset) or 0
end

function request()
  n = (n + 1) % agents
  return requests[n]
end
