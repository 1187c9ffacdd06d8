"""The Lua scripts of :class:`~asynccoord.backends.redis.RedisLockStore`: each lock operation, run atomically.

Each operation of the lock contract is one script that the Redis server runs atomically,
judging expiry by its own ``TIME`` (or a test clock passed in), never by a caller's clock.
A name's live leases are a sorted set of owner token -> expiry beside a hash of their
metadata, and its fencing tokens come from an ``INCR`` counter that is never deleted: the
fencing-token scheme of M. Kleppmann ("How to do distributed locking", 2016). Every script
starts with :data:`PRELUDE`: the clock, exact float text, token comparison as decimal
strings (Lua numbers are doubles, exact only up to 2**53; tokens go to 2**63 - 1), and the
key expiry that lets the server delete a crashed holder's keys by itself. The comment
above each script gives its ``KEYS``, ``ARGV`` and reply.
"""

from __future__ import annotations

__all__ = ("ACQUIRE", "ADVANCE", "FENCE", "LIST", "PRELUDE", "RELEASE", "RENEW_MANY", "SCRIPTS")

PRELUDE = """
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function fmt(x) return string.format('%.17g', x) end
local function token_lt(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function keep(zset, meta, now, slack_ms)
  local top = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
  if #top == 0 then
    redis.call('DEL', zset, meta)
    return
  end
  local ms = math.ceil((tonumber(top[2]) - now) * 1000) + slack_ms
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', zset, ms)
  redis.call('PEXPIRE', meta, ms)
end
"""
"""Shared by every script: the clock (the server's ``TIME`` unless a test clock's time is
passed), exact float text, token comparison as decimal strings, and the key expiry of a
name's longest lease plus the store's ``key_slack_ms``."""

# KEYS: zset, meta, counter. ARGV: owner, holder, permits, ttl_s, now ('' = server), slack_ms.
# Returns {1, fencing_token, acquired_at, expires_at} or {0, live, earliest_expiry, now}.
ACQUIRE = (
    PRELUDE
    + """
local now = clock(ARGV[5])
local mine = redis.call('ZSCORE', KEYS[1], ARGV[1])
if mine and tonumber(mine) > now then  -- a retried call whose first attempt was granted
  local meta = redis.call('HGET', KEYS[2], ARGV[1])
  local token, _, acquired = string.match(meta, '^(%d+)|(%d+)|([^|]+)|')
  return {1, token, acquired, mine}
end
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
if #lapsed > 0 then
  redis.call('ZREM', KEYS[1], unpack(lapsed))
  redis.call('HDEL', KEYS[2], unpack(lapsed))
end
local live = redis.call('ZCARD', KEYS[1])
if live >= tonumber(ARGV[3]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, live, first[2], fmt(now)}
end
local token = redis.call('INCR', KEYS[3])
local expires = now + tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], fmt(expires), ARGV[1])
local token_text = string.format('%d', token)
redis.call('HSET', KEYS[2], ARGV[1], token_text .. '|' .. ARGV[3] .. '|' .. fmt(now) .. '|' .. ARGV[2])
keep(KEYS[1], KEYS[2], now, tonumber(ARGV[6]))
return {1, token_text, fmt(now), fmt(expires)}
"""
)

# KEYS: zset, meta, counter. ARGV: owner, now. Returns 1 if the lease was live, 0 if it had
# lapsed (deleted either way), or "<now> <fencing counter>" if it is not there.
RELEASE = (
    PRELUDE
    + """
local now = clock(ARGV[2])
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return fmt(now) .. ' ' .. (redis.call('GET', KEYS[3]) or '0') end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('DEL', KEYS[1], KEYS[2]) end
if tonumber(score) > now then return 1 end
return 0
"""
)

# KEYS: zset1, meta1, zset2, meta2, ... ARGV: now, slack_ms, owner1, ttl1, owner2, ttl2, ...
# Returns per lease the new expiry, or '' if it had lapsed (never revived).
RENEW_MANY = (
    PRELUDE
    + """
local now = clock(ARGV[1])
local slack = tonumber(ARGV[2])
local out = {}
local touched = {}
for i = 1, #KEYS / 2 do
  local zset, meta = KEYS[2 * i - 1], KEYS[2 * i]
  local owner, ttl = ARGV[2 * i + 1], tonumber(ARGV[2 * i + 2])
  local score = redis.call('ZSCORE', zset, owner)
  if score and tonumber(score) > now then
    local expires = now + ttl
    redis.call('ZADD', zset, 'XX', fmt(expires), owner)
    out[i] = fmt(expires)
    touched[zset] = meta
  else
    out[i] = ''
  end
end
for zset, meta in pairs(touched) do keep(zset, meta, now, slack) end
return out
"""
)

# KEYS: zset, meta. ARGV: now. Returns {now, owner1, expiry1, meta1, ...} of the live leases.
LIST = (
    PRELUDE
    + """
local now = clock(ARGV[1])
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(now), '+inf', 'WITHSCORES')
local out = {fmt(now)}
for i = 1, #live, 2 do
  out[#out + 1] = live[i]
  out[#out + 1] = live[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], live[i]) or ''
end
return out
"""
)

# KEYS: fence. ARGV: token, now, with_data ('1'/'0'), data.
# Returns {1, token, updated_at} or {0, highest}.
FENCE = (
    PRELUDE
    + """
local now = clock(ARGV[2])
local current = redis.call('HGET', KEYS[1], 'token')
if current and token_lt(ARGV[1], current) then return {0, current} end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'updated_at', fmt(now))
if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'data', ARGV[4]) end
return {1, ARGV[1], fmt(now)}
"""
)

# KEYS: counter. ARGV: at_least. Moves the counter up to at_least, never down.
# Returns the counter before the call ('0' when it did not exist).
ADVANCE = (
    PRELUDE
    + """
local current = redis.call('GET', KEYS[1]) or '0'
if token_lt(current, ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return current
"""
)

SCRIPTS = {
    "acquire": ACQUIRE,
    "release": RELEASE,
    "renew_many": RENEW_MANY,
    "list": LIST,
    "fence": FENCE,
    "advance": ADVANCE,
}
"""Each script by the name the store registers it under (``store._scripts[name]``)."""
