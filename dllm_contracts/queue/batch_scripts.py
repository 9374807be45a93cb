"""Lua scripts of a batch's life: its ingestion (a chunk queued and its cursor moved in one step), its
lease, and its status transitions. Each names every key it touches in KEYS (see ``scripts``)."""

from __future__ import annotations

from dllm_contracts.queue.request_scripts import _ADD_PENDING
from dllm_contracts.queue.scripts import _EFFECTS

# KEYS: batch pending, live set, wakeup, batch arrivals, sizes, batch hash, batch results, batch members,
#   then one request hash per line queued
# ARGV: gateway id, cursor from, cursor to, batch TTL seconds, lines queued, lines recorded as errors, then
#   per line queued its score, max tokens and payload json, then per error line its results field and json
# One chunk of a batch's input in one step: its lines queued in the batch lane (each a member of the
# batch), its lines that cannot run recorded as error lines (counted failed once), and the batch's
# ingestion cursor moved from ``from`` to ``to``, only if this gateway holds the batch's lease and the
# cursor is where it read it: a crash between two chunks can neither skip nor repeat a line. Returns 1
# when done, 0 when the gateway no longer holds the batch or the cursor moved, 2 when the batch is being
# cancelled (no line is queued then; its lines go to the error file), -1 when the batch is gone.
INGEST = (
    _EFFECTS
    + _ADD_PENDING
    + """
local fields = redis.call('HMGET', KEYS[6], 'status', 'owner', 'cursor')
if not fields[1] then return -1 end
if fields[2] ~= ARGV[1] or tonumber(fields[3] or '0') ~= tonumber(ARGV[2]) then return 0 end
if fields[1] == 'cancelling' and tonumber(ARGV[5]) > 0 then return 2 end
local batch = KEYS[6]:match('[^:]+$')
local queued, errors = tonumber(ARGV[5]), tonumber(ARGV[6])
local fresh = fresh_requests(9)
add_pending(fresh, 9, 7, batch)
for i = 9, #KEYS do redis.call('RPUSH', KEYS[8], KEYS[i]:match('[^:]+$')) end
local at = 7 + 3 * queued
for j = 0, errors - 1 do
  if redis.call('HSETNX', KEYS[7], ARGV[at + 2 * j], ARGV[at + 2 * j + 1]) == 1 then
    redis.call('HINCRBY', KEYS[6], 'failed', 1)
  end
end
redis.call('HSET', KEYS[6], 'cursor', ARGV[3])
for i = 7, 8 do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('EXPIRE', KEYS[i], tonumber(ARGV[4])) end
end
return 1
"""
)

# KEYS: batch leases, batch hash; ARGV: gateway id, lease (ms), '1' to renew only (else take)
# A batch's lease: taken by a gateway when no live gateway holds it (its deadline, Redis's clock, passed,
# or it has none), renewed by the gateway holding it. Returns 1 when this gateway holds it now, 0 when
# another does, -1 when the batch has ended or is gone (it leaves the leases then).
BATCH_LEASE = """
local id = KEYS[2]:match('[^:]+$')
local fields = redis.call('HMGET', KEYS[2], 'status', 'owner')
local status = fields[1]
if not status or status == 'completed' or status == 'failed' or status == 'cancelled' or status == 'expired' then
  redis.call('ZREM', KEYS[1], id)
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if fields[2] ~= ARGV[1] then
  local deadline = redis.call('ZSCORE', KEYS[1], id)
  if ARGV[3] == '1' or (deadline and tonumber(deadline) > now) then return 0 end
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
redis.call('HSET', KEYS[2], 'owner', ARGV[1])
return 1
"""

# KEYS: batch hash
# ARGV: the new status, a timestamp field to set if absent ('' for none), now (seconds), then the statuses
#   it may move from
# Moves a batch to a new status only from one of the given ones, so that transitions racing each other (a
# cancel and the start of the batch's lines, a cancel and its finalizing) cannot undo one another.
# Returns 1 when it moved, 0 when the batch was in another status.
BATCH_STATUS = """
local status = redis.call('HGET', KEYS[1], 'status')
for i = 4, #ARGV do
  if status == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1])
    if ARGV[2] ~= '' then redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[3]) end
    return 1
  end
end
return 0
"""
