-- SPDX-License-Identifier: Apache-2.0
-- wrk script for durable HTTP submits: every request carries a unique Idempotency-Key, so
-- each one is a new call (a calls row + an outbox row committed before the 202).
--   wrk -t2 -c32 -d10s --latency -s bench/wrk_submit.lua http://127.0.0.1:8081
-- Keys: <run>-<thread>-<counter>; <run> is random per wrk invocation so repeated runs against
-- one database never replay. Non-2xx answers are counted and printed at the end.
local counter = 0
local threads = {}
local run_id = nil

function setup(thread)
   if not run_id then
      math.randomseed(os.time())
      run_id = string.format("%08x", math.random(0, 0x7fffffff))
   end
   thread:set("tid", #threads + 1)
   thread:set("run", run_id)
   table.insert(threads, thread)
end

function init(args)
   bad = 0
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
end

function request()
   counter = counter + 1
   local key = run .. "-" .. tid .. "-" .. counter
   local body = '{"tool":"charge","args":{"amount":' .. (counter % 1000 + 1) ..
                ',"currency":"EUR","note":"bench"}}'
   wrk.headers["Idempotency-Key"] = key
   return wrk.format(nil, "/v1/tool-calls", nil, body)
end

function response(status, headers, body)
   if status ~= 202 then bad = bad + 1 end
end

function done(summary, latency, requests)
   local b = 0
   for _, t in ipairs(threads) do b = b + (t:get("bad") or 0) end
   io.write(string.format("non-202 responses: %d\n", b))
   io.write(string.format("p50 %.2f ms  p99 %.2f ms  max %.2f ms\n",
      latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000))
end
