"""The Lua scripts of :class:`~delayq.schedule.redis.RedisSchedule`: each ``add``,
``move`` and ``expire`` is one script over its batch (see that module for the keys)."""

from __future__ import annotations

from delayq.schedule.base import REPLACEABLE
from delayq.schedule.entry import FINISHED

__all__ = ["ADD", "EXPIRE", "MOVE"]

_LUA_BATCH = """
local zadds, zrems, counts = {}, {}, {}
local function zadd(key, m, score)
  local l = zadds[key]
  if not l then l = {}; zadds[key] = l end
  l[#l + 1] = score or 0; l[#l + 1] = m
end
local function zrem(key, m)
  local l = zrems[key]
  if not l then l = {}; zrems[key] = l end
  l[#l + 1] = m
end
local function count(key, tier, by)
  local c = counts[key]
  if not c then c = {}; counts[key] = c end
  c[tier] = (c[tier] or 0) + by
end
local function flush()
  for key, l in pairs(zrems) do
    for i = 1, #l, 1000 do redis.call('ZREM', key, unpack(l, i, math.min(i + 999, #l))) end
  end
  for key, l in pairs(zadds) do
    for i = 1, #l, 2000 do redis.call('ZADD', key, unpack(l, i, math.min(i + 1999, #l))) end
  end
  for key, c in pairs(counts) do
    for tier, by in pairs(c) do
      if by ~= 0 then redis.call('HINCRBY', key, tier, by) end
    end
  end
  zadds, zrems, counts = {}, {}, {}
end
"""
"""Each script's sorted-set writes and tier counts are gathered and written at its end,
a command per set and counter instead of one per entry (``flush``); the entry's own hash
is written at once. Removals go first: an id a move's batch names twice is moved twice
to the one target state, so its second removal and addition are of the same member in
the same set, and the counts add up whatever their order."""

_LUA_SETS = (
    f"""
local REPLACEABLE = {{{", ".join(f"['{s.value}']=true" for s in REPLACEABLE)}}}
local FINISHED = {{{", ".join(f"['{s.value}']=true" for s in FINISHED)}}}
local function member(due, id) return string.format('%015d', tonumber(due)) .. ':' .. id end
"""
    + _LUA_BATCH
)

# ARGV = prefix, a JSON array of the entries, each its 17 FIELDS as strings or null (the
# body: null, or the index of its ARGV, 3 on: bytes stay out of JSON). One argument for the
# lot: a batch costs the client one encoding, not 17 arguments an entry.
ADD = (
    _LUA_SETS
    + """
local p, out, last = ARGV[1], {}, nil
local names = {'id','namespace','routing_key','due_at_ms','tier','published_at_ms','size',
  'destinations','business_key','labels','state','generation','changed_at_ms','body',
  'content_type','headers','delay_ms'}
for _, e in ipairs(cjson.decode(ARGV[2])) do
  local id, ns = e[1], e[2]
  local key = p .. 'e:' .. id
  local old = redis.call('HMGET', key, 'state', 'namespace', 'due_at_ms', 'business_key', 'tier')
  if old[1] and (not REPLACEABLE[old[1]] or (old[1] == 'cancelled' and old[2] == ns)) then
    out[#out + 1] = 0
  else
    if old[1] then
      zrem(p .. 's:' .. old[2] .. ':' .. old[1], member(old[3], id))
      count(p .. 'c:' .. old[2] .. ':' .. old[1], old[5], -1)
      redis.call('ZREM', p .. 'f:' .. old[2], id)
      if old[4] then redis.call('SREM', p .. 'k:' .. old[4], id) end
      redis.call('DEL', key)
    end
    local kv = {}
    for f = 2, #names do
      local v = e[f]
      if v ~= cjson.null then
        if f == 14 then v = ARGV[tonumber(v)] end
        kv[#kv + 1] = names[f]
        kv[#kv + 1] = v
      end
    end
    redis.call('HSET', key, unpack(kv))
    zadd(p .. 's:' .. ns .. ':' .. e[11], member(e[4], id))
    count(p .. 'c:' .. ns .. ':' .. e[11], e[5], 1)
    if ns ~= last then
      redis.call('SADD', p .. 'namespaces', ns)
      last = ns
    end
    if e[9] ~= cjson.null then redis.call('SADD', p .. 'k:' .. e[9], id) end
    out[#out + 1] = 1
  end
end
flush()
return out
"""
)

# ARGV = prefix, to, now_ms, due_at_ms ('' unchanged), generation ('' unchanged), tier
# ('' unchanged), allowed states (comma-separated), the ids (a JSON array). Returns per id
# its state after ('' none).
MOVE = (
    _LUA_SETS
    + """
local p, to, now, due, gen, tier = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local allowed = {}
for s in string.gmatch(ARGV[7], '[^,]+') do allowed[s] = true end
local out = {}
for _, id in ipairs(cjson.decode(ARGV[8])) do
  local key = p .. 'e:' .. id
  local st = redis.call('HMGET', key, 'state', 'namespace', 'due_at_ms', 'tier')
  if not st[1] then
    out[#out + 1] = ''
  elseif allowed[st[1]] then
    local new = st[3]
    if due ~= '' then new = due end
    zrem(p .. 's:' .. st[2] .. ':' .. st[1], member(st[3], id))
    zadd(p .. 's:' .. st[2] .. ':' .. to, member(new, id))
    local newtier = st[4]
    if tier ~= '' then newtier = tier end
    count(p .. 'c:' .. st[2] .. ':' .. st[1], st[4], -1)
    count(p .. 'c:' .. st[2] .. ':' .. to, newtier, 1)
    if gen ~= '' then
      redis.call('HSET', key, 'state', to, 'changed_at_ms', now, 'due_at_ms', new,
                 'tier', newtier, 'generation', gen)
    else
      redis.call('HSET', key, 'state', to, 'changed_at_ms', now, 'due_at_ms', new,
                 'tier', newtier)
    end
    if FINISHED[to] then
      zadd(p .. 'f:' .. st[2], id, now)
    elseif FINISHED[st[1]] then
      zrem(p .. 'f:' .. st[2], id)
    end
    out[#out + 1] = to
  else
    out[#out + 1] = st[1]
  end
end
flush()
return out
"""
)

# ARGV = prefix, namespace, cutoff, then ids finished before it (checked again here).
EXPIRE = (
    _LUA_SETS
    + """
local p, ns, cutoff, gone = ARGV[1], ARGV[2], tonumber(ARGV[3]), 0
for i = 4, #ARGV do
  local id = ARGV[i]
  local key = p .. 'e:' .. id
  local st = redis.call('HMGET', key, 'state', 'changed_at_ms', 'due_at_ms', 'business_key', 'tier')
  redis.call('ZREM', p .. 'f:' .. ns, id)
  if st[1] and FINISHED[st[1]] and tonumber(st[2]) < cutoff then
    redis.call('ZREM', p .. 's:' .. ns .. ':' .. st[1], member(st[3], id))
    redis.call('HINCRBY', p .. 'c:' .. ns .. ':' .. st[1], st[5], -1)
    if st[4] then redis.call('SREM', p .. 'k:' .. st[4], id) end
    redis.call('DEL', key)
    gone = gone + 1
  end
end
return gone
"""
)
