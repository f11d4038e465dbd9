-- The forward-auth question a proxy asks for POST /api/agent/heartbeat from 1 000 rotating
-- agents (X-Agent-ID agent-0000 .. agent-0999): GET /forward with the original method and URI
-- in X-Forwarded-Method / X-Forwarded-Uri, as Caddy, Traefik and the Express client send it.
local agents = tonumber(os.getenv("BENCH_AGENTS") or "1000")
local requests = {}
local n = 0

function setup(thread)
  thread:set("offset", math.random(0, agents - 1))
end

function init(args)
  for i = 0, agents - 1 do
    requests[i] = wrk.format("GET", "/forward", {
      ["X-Forwarded-Method"] = "POST",
      ["X-Forwarded-Uri"] = "/api/agent/heartbeat",
      ["X-Agent-ID"] = string.format("agent-%04d", i),
    })
  end
  n = tonumber(offset) or 0
end

function request()
  n = (n + 1) % agents
  return requests[n]
end
