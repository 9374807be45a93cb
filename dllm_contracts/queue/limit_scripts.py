"""Lua scripts of a tenant's limits, shared by every gateway replica and atomic: a request's admission
against the tenant's requests and tokens per minute and its requests in flight (``LIMIT_ADMIT``), its end
(``LIMIT_RELEASE``), a batch's lines against the tenant's queued batch lines (``BATCH_LINES_ADMIT``).

Windows are fixed minutes of Redis's clock (one clock for every replica): a window's counts start from
zero when the next minute starts. Each script names every key it touches in KEYS, all under the service's
hash tag (see ``keys``)."""

from __future__ import annotations

from dllm_contracts.queue.scripts import _EFFECTS

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: the tenant's window hash, its running set
# ARGV: requests per window, tokens per window, requests in flight (0: no limit, each), the request's
#   tokens, its ticket, the ticket's time to live (ms), the window's span (ms)
# Admits the request if every limit holds, counting it (and holding its ticket, where requests in flight
# are limited); tickets past their expiry are dropped first. Returns {refused ('' when admitted;
# 'too_large': its tokens alone exceed the limit; 'requests', 'tokens' or 'concurrency': the limit that
# refused it), requests and tokens counted in the window, requests in flight, ms until the window ends,
# the window's start}.
LIMIT_ADMIT = (
    _EFFECTS
    + _NOW
    + """
local rpm, tpm, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost, span = tonumber(ARGV[4]), tonumber(ARGV[7])
local window = now - now % span
local held = redis.call('HMGET', KEYS[1], 'window', 'requests', 'tokens')
local requests, tokens = 0, 0
if tonumber(held[1]) == window then requests, tokens = tonumber(held[2]) or 0, tonumber(held[3]) or 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local running = redis.call('ZCARD', KEYS[2])
local refused = ''
if tpm > 0 and cost > tpm then refused = 'too_large'
elseif rpm > 0 and requests + 1 > rpm then refused = 'requests'
elseif tpm > 0 and tokens + cost > tpm then refused = 'tokens'
elseif most > 0 and running + 1 > most then refused = 'concurrency'
end
local reset = window + span - now
if refused == '' then
  requests, tokens = requests + 1, tokens + cost
  redis.call('HSET', KEYS[1], 'window', window, 'requests', requests, 'tokens', tokens)
  redis.call('PEXPIRE', KEYS[1], reset + span)
  if most > 0 then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[5])
    redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[6]))
    running = running + 1
  end
end
return {refused, requests, tokens, running, reset, window}
"""
)

# KEYS: the tenant's window hash, its running set
# ARGV: the request's ticket, the start of the window it was admitted in, tokens to give back
# The request ended: its ticket is dropped, and tokens it was counted for but did not use are given back
# to its window, if that window is still the current one.
LIMIT_RELEASE = """
redis.call('ZREM', KEYS[2], ARGV[1])
local refund = tonumber(ARGV[3])
local held = redis.call('HMGET', KEYS[1], 'window', 'tokens')
if refund > 0 and tonumber(held[1]) == tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'tokens', math.max(0, (tonumber(held[2]) or 0) - refund))
end
return 1
"""

# KEYS: the tenant's batch lines hash
# ARGV: the tenant's limit (0: none), the batch's id, its lines, time to live of its reservation (ms)
# Reserves a batch's lines if the tenant's batches not yet ended (reservations past their expiry dropped)
# leave room for them. Returns {1 (reserved) or 0, the lines reserved with it or without it}.
BATCH_LINES_ADMIT = (
    _EFFECTS
    + _NOW
    + """
local limit, lines, ttl = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
local held, total = redis.call('HGETALL', KEYS[1]), 0
for i = 1, #held, 2 do
  local count, expiry = string.match(held[i + 1], '(%d+) (%d+)')
  if not expiry or tonumber(expiry) <= now then
    redis.call('HDEL', KEYS[1], held[i])
  elseif held[i] ~= ARGV[2] then
    total = total + tonumber(count)
  end
end
if limit > 0 and total + lines > limit then return {0, total} end
redis.call('HSET', KEYS[1], ARGV[2], lines .. ' ' .. string.format('%d', now + ttl))
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, total + lines}
"""
)
