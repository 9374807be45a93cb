"""Lua scripts of what a gateway does to a request: enqueue it (``ENQUEUE``; ``_ADD_PENDING`` is shared
with a batch's ``INGEST``) and cancel it (``CANCEL``). Each names every key it touches in KEYS (see
``scripts``, which holds the workers' side: claiming, renewing, reaping, committing, releasing)."""

from __future__ import annotations

from dllm_contracts.queue.scripts import _EFFECTS, _FINISH

# KEYS: pending, request hash, events stream, cancelled set, live set, arrivals, sizes[, batch hash,
#   batch results]
# ARGV: done json (its meta {}: the request's own meta is put in), ttl seconds, '1' to end it only if
#   still pending
# Cancels a request: a pending one completes at once (returns 1); an in-flight one is flagged for its
# worker (2), or left running when only a pending one may end (3).
CANCEL = (
    _EFFECTS
    + _FINISH
    + """
local id = KEYS[2]:match('[^:]+$')
local state = redis.call('HGET', KEYS[2], 'state')
if not state or state == 'done' then return 0 end
local first = #KEYS >= 9 and 8 or nil
local batch, missing = batch_of(2, first)
if missing then return redis.error_reply(missing) end
if redis.call('ZREM', KEYS[1], id) == 1 then
  redis.call('ZREM', KEYS[6], id)
  local done = ARGV[1]
  local ok, payload = pcall(cjson.decode, redis.call('HGET', KEYS[2], 'payload') or '')
  local at = string.find(done, '"meta":{}', 1, true)
  if ok and type(payload) == 'table' and type(payload['meta']) == 'table' and next(payload['meta']) and at then
    done = string.sub(done, 1, at + 6) .. cjson.encode(payload['meta']) .. string.sub(done, at + 9)
  end
  finish(2, 3, 5, 7, id, done, tonumber(ARGV[2]), batch, first)
  return 1
end
if ARGV[3] == '1' then return 3 end
redis.call('SADD', KEYS[4], id)
return 2
"""
)

# Shared by ENQUEUE and INGEST: KEYS pending (the lane's), live set, wakeup, arrivals (the lane's), sizes;
# the requests' hashes from KEYS[first] on, their score, max tokens and payload from ARGV[at] on. A head
# start (ms; a priority's) dates their arrival that much earlier (later, when negative): the queue's wait-
# based order (who waited longest is offered first among the aged) puts them that much ahead. Their sizes
# entry keeps the head start too, so that the time they really waited can be told apart.
_ADD_PENDING = """
local function fresh_requests(first)
  local fresh = {}
  for i = first, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 0 then table.insert(fresh, i) end
  end
  return fresh
end

local function add_pending(fresh, first, at, batch, head_start)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - (head_start or 0)
  for _, i in ipairs(fresh) do
    local a = 3 * (i - first) + at
    local score, tokens, payload = ARGV[a], ARGV[a + 1], ARGV[a + 2]
    local id = KEYS[i]:match('[^:]+$')
    redis.call('HSET', KEYS[i], 'payload', payload, 'state', 'pending', 'score', score, 'generated', '[]',
      'attempts', 0, 'batch', batch, 'enqueued', now)
    redis.call('ZADD', KEYS[1], tonumber(score), id)
    redis.call('ZADD', KEYS[4], now, id)
    redis.call('HSET', KEYS[5], id, score .. ' ' .. tokens .. ' ' .. now .. ' ' .. (head_start or 0))
    redis.call('SADD', KEYS[2], id)
  end
  if #fresh > 0 then redis.call('PUBLISH', KEYS[3], #fresh) end
end
"""

# KEYS: pending (the lane's), live set, wakeup, arrivals (the lane's), sizes, inflight, interactive pending,
#   then one request hash per request
# ARGV: max queued (0: unlimited), batch id ('' for none), head start (ms: the requests' priority), then per
#   request its prompt length (its score), its max tokens and its payload json
# Enqueues every request or none (returns 0 when the queue cannot take them all: the interactive lane's
# pending and every request in flight count against the limit, a batch's backlog does not), stamped with
# Redis's clock (a request's wait counts from then). Idempotent: a request id that exists already (a retry
# after a reply lost to a Redis fault) is left as it is.
ENQUEUE = (
    _EFFECTS
    + _ADD_PENDING
    + """
local fresh = fresh_requests(8)
local limit = tonumber(ARGV[1])
if limit > 0 and #fresh > 0 and redis.call('ZCARD', KEYS[7]) + redis.call('ZCARD', KEYS[6]) + #fresh > limit then
  return 0
end
add_pending(fresh, 8, 4, ARGV[2], tonumber(ARGV[3]))
return 1
"""
)
