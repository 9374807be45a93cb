"""Lua scripts that make every queue transition atomic."""

from __future__ import annotations

# Every script names each key it touches in KEYS (a Redis Cluster routes a script by its keys, and all
# keys of a service share one hash tag, so they live on one node). Where the ids are not known before
# the script runs (claiming, reaping), the caller reads candidate ids first and the script re-checks
# each one, so a candidate another worker took meanwhile is skipped, never taken twice.

# KEYS: pending, inflight, then one request hash per candidate
# ARGV: max score, max count, lease deadline (ms), worker id, then the candidates' ids (shortest first)
# Sand filling: the shortest candidates still pending whose prefix fits the maximum, moved to in-flight.
CLAIM = """
local out, taken = {}, 0
for i = 3, #KEYS do
  if taken >= tonumber(ARGV[2]) then break end
  local id = ARGV[i + 2]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), id)
    redis.call('HSET', KEYS[i], 'state', 'running', 'worker', ARGV[4])
    redis.call('HINCRBY', KEYS[i], 'attempts', 1)
    local fields = redis.call('HMGET', KEYS[i], 'payload', 'generated')
    table.insert(out, id)
    table.insert(out, fields[1] or '')
    table.insert(out, fields[2] or '[]')
    taken = taken + 1
  end
end
return out
"""

# KEYS: inflight, then one request hash per id; ARGV: new deadline (ms), worker id, ids...
# Renews the leases this worker still owns; returns the ids it no longer owns.
RENEW = """
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local owner = redis.call('HGET', KEYS[i - 1], 'worker')
  if owner == ARGV[2] and redis.call('ZSCORE', KEYS[1], id) then
    redis.call('ZADD', KEYS[1], tonumber(ARGV[1]), id)
  else
    table.insert(lost, id)
  end
end
return lost
"""

# KEYS: inflight, pending, wakeup channel, then one request hash per candidate
# ARGV: now (ms), then the candidates' ids (leases read as expired)
# Puts every candidate whose lease is still expired back into the pending set, scored by its prefix.
REAP = """
local reaped = 0
for i = 4, #KEYS do
  local id = ARGV[i - 2]
  local deadline = redis.call('ZSCORE', KEYS[1], id)
  if deadline and tonumber(deadline) <= tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HSET', KEYS[i], 'state', 'pending', 'worker', '')
    local score = tonumber(redis.call('HGET', KEYS[i], 'score') or '0')
    redis.call('ZADD', KEYS[2], score, id)
    reaped = reaped + 1
  end
end
if reaped > 0 then redis.call('PUBLISH', KEYS[3], reaped) end
return reaped
"""

# Events go to a per-request stream (XADD), read with a cursor (XREAD): unlike a popped list, an event
# whose reply is lost to a fault (a blocked reader that timed out) stays there to be read again.
_EFFECTS = "if redis.replicate_commands then redis.replicate_commands() end\n"  # XADD '*' on Redis 6

# KEYS: inflight, request hash, events stream; ARGV: worker id, event json, generated json, score
# Records a committed block, only if this worker still owns the request.
PROGRESS = (
    _EFFECTS
    + """
if redis.call('HGET', KEYS[2], 'worker') ~= ARGV[1] or not redis.call('ZSCORE', KEYS[1], KEYS[2]:match('[^:]+$')) then
  return 0
end
redis.call('HSET', KEYS[2], 'generated', ARGV[3], 'score', ARGV[4])
redis.call('XADD', KEYS[3], '*', 'e', ARGV[2])
return 1
"""
)


# Shared by COMPLETE and CANCEL. A finished member of a batch is counted and its result kept; the
# batch's hash and results list come last in KEYS (the caller knows the batch from the request's
# payload). A batch member that came without them is refused before anything changes: a batch whose
# member went uncounted would never finish.
_FINISH = """
local function batch_of(request, first)
  local batch = redis.call('HGET', KEYS[request], 'batch') or ''
  if batch == '' then return '' end
  local key, results = KEYS[first], KEYS[first + 1]
  if key and results and results == key .. ':results' and key:sub(-#batch - 1) == ':' .. batch then
    return batch
  end
  return nil, 'request ' .. KEYS[request] .. ' belongs to batch ' .. batch .. ': pass its keys'
end

local function finish(request, events, live, id, done_json, ttl, batch, first)
  redis.call('SREM', KEYS[live], id)
  redis.call('HSET', KEYS[request], 'state', 'done', 'result', done_json)
  redis.call('XADD', KEYS[events], '*', 'e', done_json)
  redis.call('EXPIRE', KEYS[request], ttl)
  redis.call('EXPIRE', KEYS[events], ttl)
  if batch == '' then return end
  local reason = cjson.decode(done_json)['finish_reason']
  if reason == 'error' or reason == 'cancelled' then
    redis.call('HINCRBY', KEYS[first], 'failed', 1)
  else
    redis.call('HINCRBY', KEYS[first], 'completed', 1)
  end
  redis.call('RPUSH', KEYS[first + 1], cjson.encode({id = id, done = done_json}))
  local left = redis.call('TTL', KEYS[first])
  if left > 0 then redis.call('EXPIRE', KEYS[first + 1], left) end
end
"""

# KEYS: inflight, request hash, events stream, cancelled set, live set[, batch hash, batch results]
# ARGV: worker id, done json, ttl seconds
# Completes a request exactly once: the first caller that still owns it wins, later ones get 0.
COMPLETE = (
    _EFFECTS
    + _FINISH
    + """
local id = KEYS[2]:match('[^:]+$')
if redis.call('HGET', KEYS[2], 'state') == 'done' then return 0 end
if redis.call('HGET', KEYS[2], 'worker') ~= ARGV[1] or not redis.call('ZSCORE', KEYS[1], id) then return 0 end
local batch, missing = batch_of(2, 6)
if missing then return redis.error_reply(missing) end
redis.call('ZREM', KEYS[1], id)
redis.call('SREM', KEYS[4], id)
finish(2, 3, 5, id, ARGV[2], tonumber(ARGV[3]), batch, 6)
return 1
"""
)

# KEYS: inflight, pending, request hash, wakeup; ARGV: worker id, generated json, score
# A draining worker hands an unfinished request back, keeping its committed blocks.
RELEASE = """
local id = KEYS[3]:match('[^:]+$')
if redis.call('HGET', KEYS[3], 'worker') ~= ARGV[1] or not redis.call('ZSCORE', KEYS[1], id) then return 0 end
redis.call('ZREM', KEYS[1], id)
redis.call('HSET', KEYS[3], 'state', 'pending', 'worker', '', 'generated', ARGV[2], 'score', ARGV[3])
redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), id)
redis.call('PUBLISH', KEYS[4], 1)
return 1
"""

# KEYS: pending, request hash, events stream, cancelled set, live set[, batch hash, batch results]
# ARGV: done json, ttl seconds
# Cancels a request: a pending one completes at once; an in-flight one is flagged for its worker.
CANCEL = (
    _EFFECTS
    + _FINISH
    + """
local id = KEYS[2]:match('[^:]+$')
local state = redis.call('HGET', KEYS[2], 'state')
if not state or state == 'done' then return 0 end
local batch, missing = batch_of(2, 6)
if missing then return redis.error_reply(missing) end
if redis.call('ZREM', KEYS[1], id) == 1 then
  finish(2, 3, 5, id, ARGV[1], tonumber(ARGV[2]), batch, 6)
  return 1
end
redis.call('SADD', KEYS[4], id)
return 2
"""
)

# KEYS: pending, live set, wakeup, then one request hash per request
# ARGV: max queued (0: unlimited), batch id ('' for none), then a score and a payload json per request
# Enqueues every request or none (returns 0 when the queue cannot take them all). Idempotent: a
# request id that exists already (a retry after a reply lost to a Redis fault) is left as it is.
ENQUEUE = """
local fresh = {}
for i = 4, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then table.insert(fresh, i) end
end
local limit = tonumber(ARGV[1])
if limit > 0 and #fresh > 0 and redis.call('SCARD', KEYS[2]) + #fresh > limit then
  return 0
end
for _, i in ipairs(fresh) do
  local score, payload = ARGV[2 * (i - 4) + 3], ARGV[2 * (i - 4) + 4]
  redis.call('HSET', KEYS[i], 'payload', payload, 'state', 'pending', 'score', score, 'generated', '[]',
    'attempts', 0, 'batch', ARGV[2])
  redis.call('ZADD', KEYS[1], tonumber(score), KEYS[i]:match('[^:]+$'))
  redis.call('SADD', KEYS[2], KEYS[i]:match('[^:]+$'))
end
if #fresh > 0 then redis.call('PUBLISH', KEYS[3], #fresh) end
return 1
"""
