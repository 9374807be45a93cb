"""Lua scripts that make every queue transition atomic: the workers' side (which requests to claim, claiming,
renewing leases, reaping expired ones, committing a block cycle, handing a request back). A gateway's
enqueue and cancel are in ``request_scripts``, a batch's life in ``batch_scripts``."""

from __future__ import annotations

# Every script names each key it touches in KEYS (a Redis Cluster routes a script by its keys, and all
# keys of a service share one hash tag, so they live on one node). Where the ids are not known before
# the script runs (claiming, reaping), the caller reads candidate ids first and the script re-checks
# each one, so a candidate another worker took meanwhile is skipped, never taken twice.

# KEYS: pending, arrivals, sizes, batch pending, batch arrivals
# ARGV: max prefix, count, max wait (ms; 0: none; negative: no bound), aged count, batch max wait (ms; 0:
#   none), batch room (how many batch lines may be offered)
# Read only: what a worker may claim. Returns {now (ms, Redis's clock), shortest, aged}: the ``count``
# shortest pending requests with a prefix of at most the maximum, interactive ones first and batch lines
# (at most the room) only where the interactive lane leaves part of the count; and the ``aged count`` that
# have waited longest, if they waited past the maximum (any wait, with no bound: the oldest pending),
# interactive ones first, then batch lines that waited past the batch bound (aging: a batch always
# progresses). Each as id, prefix, sizes ("<prompt> <max tokens> <enqueued>"), lane ('batch' or '').
CANDIDATES = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local count, aged_count, room = tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[6])
local function describe(ids, out, lane)
  for _, id in ipairs(ids) do
    table.insert(out, id)
    table.insert(out, redis.call('ZSCORE', KEYS[lane], id) or '')
    table.insert(out, redis.call('HGET', KEYS[3], id) or '')
    table.insert(out, lane == 4 and 'batch' or '')
  end
  return out
end
local function since(wait)
  if wait < 0 then return '+inf' end
  return now - wait
end
local shortest = describe(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, count), {}, 1)
local fill = math.min(room, count - #shortest / 4)
if fill > 0 then
  describe(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1], 'LIMIT', 0, fill), shortest, 4)
end
local aged = {}
if tonumber(ARGV[3]) ~= 0 then
  describe(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', since(tonumber(ARGV[3])), 'LIMIT', 0, aged_count), aged, 1)
end
local batch_wait = tonumber(ARGV[3]) < 0 and -1 or tonumber(ARGV[5])
local left = math.min(room, aged_count - #aged / 4)
if batch_wait ~= 0 and left > 0 then
  describe(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', since(batch_wait), 'LIMIT', 0, left), aged, 4)
end
return {now, shortest, aged}
"""

# A request that asked for log probabilities keeps each committed block's in its hash, fields lp:0, lp:1,
# ... (block numbers, committed in order), so that a worker taking it over returns them with the result.
_BLOCK_LOGPROBS = """
local function block_logprobs(request)
  local blocks, j = {}, 0
  while true do
    local entry = redis.call('HGET', KEYS[request], 'lp:' .. j)
    if not entry then return blocks end
    table.insert(blocks, entry)
    j = j + 1
  end
end
"""

# KEYS: pending, inflight, arrivals, batch pending, batch arrivals, then one request hash per chosen request
# ARGV: lease deadline (ms), worker id, then per chosen request its id and the prefix it was read with
# Claims each chosen request that is still pending (in either lane) with that prefix (another worker may
# have taken it, or it may have come back with more committed blocks: then the choice was not made for
# it). Returns per claimed request its id, payload, generated tokens and its blocks' log probabilities (a
# JSON list of per-block lists; empty where none were recorded).
CLAIM = (
    _BLOCK_LOGPROBS
    + """
local out = {}
for i = 6, #KEYS do
  local id, prefix = ARGV[2 * (i - 6) + 3], ARGV[2 * (i - 6) + 4]
  local lane, waits = 1, 3
  local score = redis.call('ZSCORE', KEYS[1], id)
  if not score then
    lane, waits = 4, 5
    score = redis.call('ZSCORE', KEYS[4], id)
  end
  if score and tonumber(score) == tonumber(prefix) then
    redis.call('ZREM', KEYS[lane], id)
    redis.call('ZREM', KEYS[waits], id)
    redis.call('ZADD', KEYS[2], tonumber(ARGV[1]), id)
    redis.call('HSET', KEYS[i], 'state', 'running', 'worker', ARGV[2])
    redis.call('HINCRBY', KEYS[i], 'attempts', 1)
    local fields = redis.call('HMGET', KEYS[i], 'payload', 'generated')
    table.insert(out, id)
    table.insert(out, fields[1] or '')
    table.insert(out, fields[2] or '[]')
    table.insert(out, '[' .. table.concat(block_logprobs(i), ',') .. ']')
  end
end
return out
"""
)

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

# Shared by REAP and RELEASE: a request going back to pending waits in its lane (a batch's line in the batch
# lane, given as the pending and arrivals keys that follow the interactive ones).
_LANE = """
local function back_to_pending(request, pending, arrivals, id, score)
  local batch = redis.call('HGET', KEYS[request], 'batch')
  if batch and batch ~= '' then pending, arrivals = pending + 1, arrivals + 1 end
  redis.call('ZADD', KEYS[pending], tonumber(score), id)
  redis.call('ZADD', KEYS[arrivals], tonumber(redis.call('HGET', KEYS[request], 'enqueued') or '0'), id)
end
"""

# KEYS: inflight, wakeup channel, pending, batch pending, arrivals, batch arrivals, then one request hash
#   per candidate
# ARGV: now (ms), then the candidates' ids (leases read as expired)
# Puts every candidate whose lease is still expired back into its lane's pending set, scored by its prefix,
# keeping the time it was first enqueued (its wait counts from then).
REAP = (
    _LANE
    + """
local reaped = 0
for i = 7, #KEYS do
  local id = ARGV[i - 5]
  local deadline = redis.call('ZSCORE', KEYS[1], id)
  if deadline and tonumber(deadline) <= tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HSET', KEYS[i], 'state', 'pending', 'worker', '')
    back_to_pending(i, 3, 5, id, redis.call('HGET', KEYS[i], 'score') or '0')
    reaped = reaped + 1
  end
end
if reaped > 0 then redis.call('PUBLISH', KEYS[2], reaped) end
return reaped
"""
)

# Events go to a per-request stream (XADD), read with a cursor (XREAD): unlike a popped list, an event
# whose reply is lost to a fault (a blocked reader that timed out) stays there to be read again.
_EFFECTS = "if redis.replicate_commands then redis.replicate_commands() end\n"  # XADD '*' on Redis 6

# Shared by COMMIT and CANCEL. A finished member of a batch is counted and its result kept, once per
# request id (its field in the batch's results hash is set only once); the batch's
# hash and results list follow the request's keys in KEYS (the caller knows the batch from the request's
# payload). A batch member that came without them is refused before anything changes: a batch whose
# member went uncounted would never finish.
_FINISH = """
local function batch_of(request, first)
  local batch = redis.call('HGET', KEYS[request], 'batch') or ''
  if batch == '' then return '' end
  local key, results = first and KEYS[first], first and KEYS[first + 1]
  if key and results and results == key .. ':results' and key:sub(-#batch - 1) == ':' .. batch then
    return batch
  end
  return nil, 'request ' .. KEYS[request] .. ' belongs to batch ' .. batch .. ': pass its keys'
end

local function finish(request, events, live, sizes, id, done_json, ttl, batch, first)
  local j = 0
  while redis.call('HDEL', KEYS[request], 'lp:' .. j) == 1 do j = j + 1 end  -- the result holds them
  redis.call('SREM', KEYS[live], id)
  redis.call('HDEL', KEYS[sizes], id)
  redis.call('HSET', KEYS[request], 'state', 'done', 'result', done_json)
  redis.call('XADD', KEYS[events], '*', 'e', done_json)
  redis.call('EXPIRE', KEYS[request], ttl)
  redis.call('EXPIRE', KEYS[events], ttl)
  if batch == '' then return end
  if redis.call('HSETNX', KEYS[first + 1], id, cjson.encode({id = id, done = done_json})) == 0 then
    return  -- its result is recorded (and counted) already
  end
  local reason = cjson.decode(done_json)['finish_reason']
  if reason == 'error' or reason == 'cancelled' or reason == 'expired' then
    redis.call('HINCRBY', KEYS[first], 'failed', 1)
  else
    redis.call('HINCRBY', KEYS[first], 'completed', 1)
  end
  local left = redis.call('TTL', KEYS[first])
  if left > 0 then redis.call('EXPIRE', KEYS[first + 1], left) end
end
"""

# KEYS: inflight, cancelled, live, sizes; then per committed block a request hash and its events stream;
#   then per finished request its hash, its events stream[, its batch hash and batch results]
# ARGV: worker id, ttl seconds, blocks, results; then per block its event json ('' for a request that
#   does not stream: progress recorded, no event), generated json, score, block number and its log
#   probabilities json ('' for a request that did not ask);
#   then per result its done json and how many keys it has (2, or 4 with its batch's); then the ids
#   the worker holds
# A block cycle's whole exchange with Redis in one call. Records each committed block and completes
# each finished request (exactly once: the first caller that still owns it wins), only where this
# worker still owns the request. Returns {ids whose block was refused (lost), 1 or 0 per result (0:
# completed or taken over elsewhere), ids among those held that their clients cancelled}.
COMMIT = (
    _EFFECTS
    + _FINISH
    + """
local worker, ttl = ARGV[1], tonumber(ARGV[2])
local blocks, results = tonumber(ARGV[3]), tonumber(ARGV[4])
local function id_of(key) return KEYS[key]:match('[^:]+$') end
local function owns(key)
  return redis.call('HGET', KEYS[key], 'worker') == worker and redis.call('ZSCORE', KEYS[1], id_of(key))
end
local first_result, first_result_arg = 5 + 2 * blocks, 5 + 5 * blocks
local k, a = first_result, first_result_arg
for _ = 1, results do
  local nkeys = tonumber(ARGV[a + 1])
  local _, missing = batch_of(k, nkeys >= 4 and k + 2 or nil)
  if missing then return redis.error_reply(missing) end
  k, a = k + nkeys, a + 2
end
local lost, completed, cancelled = {}, {}, {}
k, a = 5, 5
for _ = 1, blocks do
  if owns(k) then
    redis.call('HSET', KEYS[k], 'generated', ARGV[a + 1], 'score', ARGV[a + 2])
    if ARGV[a + 4] ~= '' then redis.call('HSET', KEYS[k], 'lp:' .. ARGV[a + 3], ARGV[a + 4]) end
    if ARGV[a] ~= '' then redis.call('XADD', KEYS[k + 1], '*', 'e', ARGV[a]) end
  else
    table.insert(lost, id_of(k))
  end
  k, a = k + 2, a + 5
end
for _ = 1, results do
  local nkeys, ok = tonumber(ARGV[a + 1]), 0
  if redis.call('HGET', KEYS[k], 'state') ~= 'done' and owns(k) then
    local id = id_of(k)
    local first = nkeys >= 4 and k + 2 or nil
    redis.call('ZREM', KEYS[1], id)
    redis.call('SREM', KEYS[2], id)
    finish(k, k + 1, 3, 4, id, ARGV[a], ttl, batch_of(k, first), first)
    ok = 1
  end
  table.insert(completed, ok)
  k, a = k + nkeys, a + 2
end
for i = a, #ARGV do
  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 1 then table.insert(cancelled, ARGV[i]) end
end
return {lost, completed, cancelled}
"""
)

# KEYS: inflight, request hash, wakeup, pending, batch pending, arrivals, batch arrivals
# ARGV: worker id, generated json, score
# A worker hands an unfinished request back (draining, or a claim it cannot admit), keeping its
# committed blocks and the time it was first enqueued.
RELEASE = (
    _LANE
    + """
local id = KEYS[2]:match('[^:]+$')
if redis.call('HGET', KEYS[2], 'worker') ~= ARGV[1] or not redis.call('ZSCORE', KEYS[1], id) then return 0 end
redis.call('ZREM', KEYS[1], id)
redis.call('HSET', KEYS[2], 'state', 'pending', 'worker', '', 'generated', ARGV[2], 'score', ARGV[3])
back_to_pending(2, 4, 6, id, ARGV[3])
redis.call('PUBLISH', KEYS[3], 1)
return 1
"""
)
