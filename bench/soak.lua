-- bench/soak.sh's load: POST /api/agent/heartbeat, every request from a new agent id (so every
-- request makes a new bucket), counting the answers by status class. Run as
-- `wrk ... -s soak.lua URL -- RUN` with a RUN number unique within the soak: the ids are
-- `s<RUN>-<thread>-<n>`, never repeated across runs.
local threads = {}
local body = '{"status":"healthy","uptime":3600}'

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  prefix = "s" .. (args[1] or "0") .. "-" .. tostring(tid) .. "-"
  n = 0
  ok, refused, server, other = 0, 0, 0, 0
end

function request()
  n = n + 1
  return wrk.format("POST", "/api/agent/heartbeat", {
    ["X-Agent-ID"] = prefix .. n,
    ["Content-Type"] = "application/json",
  }, body)
end

function response(status, headers, body)
  if status >= 200 and status < 300 then
    ok = ok + 1
  elseif status == 429 then
    refused = refused + 1
  elseif status >= 500 then
    server = server + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local a, b, c, d = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    a = a + t:get("ok")
    b = b + t:get("refused")
    c = c + t:get("server")
    d = d + t:get("other")
  end
  io.write(string.format("statuses 2xx=%d 429=%d 5xx=%d other=%d\n", a, b, c, d))
end
