"""Lua scripts that make every queue transition atomic."""

from __future__ import annotations

# KEYS: pending, inflight, request hash prefix ("dllm:svc:req:")
# ARGV: max score, max count, lease deadline (ms), worker id
# Sand filling: the shortest pending requests whose prefix fits the given maximum, moved to in-flight.
CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), id)
  local key = KEYS[3] .. id
  redis.call('HSET', key, 'state', 'running', 'worker', ARGV[4])
  redis.call('HINCRBY', key, 'attempts', 1)
  local fields = redis.call('HMGET', key, 'payload', 'generated')
  table.insert(out, id)
  table.insert(out, fields[1] or '')
  table.insert(out, fields[2] or '[]')
end
return out
"""

# KEYS: inflight, request hash prefix; ARGV: new deadline (ms), worker id, ids...
# Renews the leases this worker still owns; returns the ids it no longer owns.
RENEW = """
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local owner = redis.call('HGET', KEYS[2] .. id, 'worker')
  if owner == ARGV[2] and redis.call('ZSCORE', KEYS[1], id) then
    redis.call('ZADD', KEYS[1], tonumber(ARGV[1]), id)
  else
    table.insert(lost, id)
  end
end
return lost
"""

# KEYS: inflight, pending, request hash prefix, wakeup channel; ARGV: now (ms)
# Puts every expired lease back into the pending set, scored by its prefix length.
REAP = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[1], id)
  local key = KEYS[3] .. id
  redis.call('HSET', key, 'state', 'pending', 'worker', '')
  local score = tonumber(redis.call('HGET', key, 'score') or '0')
  redis.call('ZADD', KEYS[2], score, id)
end
if #expired > 0 then redis.call('PUBLISH', KEYS[4], #expired) end
return #expired
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


# Shared by COMPLETE and CANCEL: a finished member of a batch is counted and its result kept.
_RECORD_BATCH = """
local function record_batch(request_key, id, done_json, batch_prefix)
  local batch = redis.call('HGET', request_key, 'batch')
  if not batch or batch == '' then return end
  local key = batch_prefix .. batch
  local reason = cjson.decode(done_json)['finish_reason']
  if reason == 'error' or reason == 'cancelled' then
    redis.call('HINCRBY', key, 'failed', 1)
  else
    redis.call('HINCRBY', key, 'completed', 1)
  end
  redis.call('RPUSH', key .. ':results', cjson.encode({id = id, done = done_json}))
  local ttl = redis.call('TTL', key)
  if ttl > 0 then redis.call('EXPIRE', key .. ':results', ttl) end
end
"""

# KEYS: inflight, request hash, events stream, cancelled set; ARGV: worker id, done json, ttl seconds, batch prefix
# Completes a request exactly once: the first caller that still owns it wins, later ones get 0.
COMPLETE = (
    _EFFECTS
    + _RECORD_BATCH
    + """
local id = KEYS[2]:match('[^:]+$')
if redis.call('HGET', KEYS[2], 'state') == 'done' then return 0 end
if redis.call('HGET', KEYS[2], 'worker') ~= ARGV[1] or not redis.call('ZSCORE', KEYS[1], id) then return 0 end
redis.call('ZREM', KEYS[1], id)
redis.call('SREM', KEYS[4], id)
redis.call('HSET', KEYS[2], 'state', 'done', 'result', ARGV[2])
redis.call('XADD', KEYS[3], '*', 'e', ARGV[2])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
record_batch(KEYS[2], id, ARGV[2], ARGV[4])
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

# KEYS: pending, request hash, events stream, cancelled set; ARGV: done json, ttl seconds, batch prefix
# Cancels a request: a pending one completes at once; an in-flight one is flagged for its worker.
CANCEL = (
    _EFFECTS
    + _RECORD_BATCH
    + """
local id = KEYS[2]:match('[^:]+$')
local state = redis.call('HGET', KEYS[2], 'state')
if not state or state == 'done' then return 0 end
if redis.call('ZREM', KEYS[1], id) == 1 then
  redis.call('HSET', KEYS[2], 'state', 'done', 'result', ARGV[1])
  redis.call('XADD', KEYS[3], '*', 'e', ARGV[1])
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[2]))
  record_batch(KEYS[2], id, ARGV[1], ARGV[3])
  return 1
end
redis.call('SADD', KEYS[4], id)
return 2
"""
)

# KEYS: pending, inflight, wakeup, then one request hash per request
# ARGV: max queued (0: unlimited), batch id ('' for none), then a score and a payload json per request
# Enqueues every request or none (returns 0 when the queue cannot take them all). Idempotent: a
# request id that exists already (a retry after a reply lost to a Redis fault) is left as it is.
ENQUEUE = """
local fresh = {}
for i = 4, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then table.insert(fresh, i) end
end
local limit = tonumber(ARGV[1])
if limit > 0 and #fresh > 0 and redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) + #fresh > limit then
  return 0
end
for _, i in ipairs(fresh) do
  local score, payload = ARGV[2 * (i - 4) + 3], ARGV[2 * (i - 4) + 4]
  redis.call('HSET', KEYS[i], 'payload', payload, 'state', 'pending', 'score', score, 'generated', '[]',
    'attempts', 0, 'batch', ARGV[2])
  redis.call('ZADD', KEYS[1], tonumber(score), KEYS[i]:match('[^:]+$'))
end
if #fresh > 0 then redis.call('PUBLISH', KEYS[3], #fresh) end
return 1
"""
