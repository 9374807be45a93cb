"""Lua scripts of a file's record: committing it once its bytes are in the store (charged to its tenant's
storage, refused past the tenant's quota), dropping it (deleted, or past its retention) and giving up an
upload its gateway left unfinished. Each names every key it touches in KEYS (see ``scripts``).

A record is written only after its bytes are in the store, and dropped (its id put in the trash) before
its bytes are deleted, so a record never names missing bytes; bytes without a record are named by the
uploading or the trash set until the sweeper has deleted them."""

from __future__ import annotations

from dllm_contracts.queue.keys import ServiceKeys

# KEYS: file hash, the tenant's files index, expiring set, uploading set, the tenant's storage counter
# ARGV: file id, size, quota (bytes; 0: none), enforce ('1': refuse past the quota; '0': count only),
#   retention of the record and the sets (s), created at (s), expires at (s), then the record's fields
#   and values
# Returns {1, bytes used}: committed; {0, bytes used}: refused (over the quota: nothing written); {-1, 0}:
# the upload was given up by the sweeper meanwhile (its bytes are being deleted). A file written again
# (a batch's output, finalized twice) is charged the difference.
FILE_COMMIT = """
if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then return {-1, 0} end
local size, quota, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local before = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
local used = tonumber(redis.call('GET', KEYS[5]) or '0')
if ARGV[4] == '1' and quota > 0 and used - before + size > quota then return {0, used} end
used = redis.call('INCRBY', KEYS[5], size - before)
redis.call('EXPIRE', KEYS[5], ttl)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], ARGV[6], ARGV[1])
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[1])
redis.call('EXPIRE', KEYS[3], ttl)
redis.call('ZREM', KEYS[4], ARGV[1])
return {1, used}
"""

# KEYS: file hash, the tenant's files index, expiring set, trash set, the tenant's storage counter
# ARGV: file id, now (s), only expired ('1': only a record whose retention has ended), retention of the
#   sets (s)
# The record gone, its bytes no longer charged to its tenant, its id in the trash (its bytes are deleted
# next; a record from before files had a store was never charged). Returns 1 when a record was dropped, 0
# when there was none (or it is not expired).
FILE_DROP = """
local record = redis.call('HMGET', KEYS[1], 'bytes', 'expires_at', 'object')
if ARGV[3] == '1' and record[2] and tonumber(record[2]) > tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[3], record[2], ARGV[1])
  return 0
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[4], tonumber(ARGV[4]))
if not record[1] then return 0 end
redis.call('DEL', KEYS[1])
if record[3] and redis.call('DECRBY', KEYS[5], record[1]) <= 0 then redis.call('DEL', KEYS[5]) end
return 1
"""

# KEYS: uploading set, trash set, file hash
# ARGV: file id, started before (s), now (s), retention of the trash (s)
# An upload that started before the cutoff and never committed: its id moved to the trash (a commit
# after this is refused). Returns 1 when moved, 0 otherwise.
FILE_ABANDON = """
local started = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not started or tonumber(started) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[4]))
return 1
"""

SCRIPTS = ("FILE_COMMIT", "FILE_DROP", "FILE_ABANDON")


def commit_keys(keys: ServiceKeys, file_id: str, tenant: str) -> list[str]:
    return [
        keys.file(file_id),
        keys.files_of(tenant),
        keys.files_expiring,
        keys.files_uploading,
        keys.storage_used(tenant),
    ]


def drop_keys(keys: ServiceKeys, file_id: str, tenant: str) -> list[str]:
    return [
        keys.file(file_id),
        keys.files_of(tenant),
        keys.files_expiring,
        keys.files_trash,
        keys.storage_used(tenant),
    ]


def abandon_keys(keys: ServiceKeys, file_id: str) -> list[str]:
    return [keys.files_uploading, keys.files_trash, keys.file(file_id)]
