"""The Redis side of the global scheduler: keys, atomic scripts, retries.

Every key of a topic starts ``fd:<topic>:``:

- ``ins:<name>``: an instance's heartbeat, its live load as JSON; expires
  after ``--scheduler-expire-period`` unless refreshed (gone = dead);
- ``load:<shard>``: sorted set, instance name -> load (running + waiting +
  queued), the instance table FastDeploy shards by ``--scheduler-load-shards-num``;
- ``q:<name>``: the instance's queue of tickets (requests it accepted, FIFO);
- ``req:<ticket>``: hash ``origin`` (the accepting instance), ``body``;
- ``claim:<ticket>``: who took it (set once: a request is never taken twice,
  even when a retried push queued it twice);
- ``abort:<ticket>``: the accepting instance no longer wants it;
- ``res:<name>``: results for the requests ``name`` accepted; its reader
  removes entries only once it has handled them (``ack_results``), so a
  reply lost when Redis goes down loses no result;
- ``bell:<name>``: at most one element, pushed with every result: what the
  reader blocks on while ``res:<name>`` is empty.

Every request key lives ``--scheduler-ttl`` seconds. Calls go through
``retry``: a connection error (Redis down or restarting, loading its data)
is retried with backoff until it succeeds or the caller is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fd_core.cluster.config import GlobalSchedulerConfig

__all__ = ["RedisStore", "TRANSIENT"]

logger = logging.getLogger("fd_core.cluster")
T = TypeVar("T")
TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)  # BusyLoadingError is a ConnectionError
BACKOFF_START, BACKOFF_MAX = 0.05, 2.0

# take the oldest ticket of queue ARGV[2] for instance ARGV[3]: skipped (and dropped) when
# aborted, or when its accepting instance is gone; claimed once; marks it started for its origin
_TAKE = """
local p, victim, me, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
for i = 1, 32 do
  local t = redis.call('LPOP', p .. 'q:' .. victim)
  if not t then return false end
  local origin = redis.call('HGET', p .. 'req:' .. t, 'origin')
  local wanted = origin and redis.call('EXISTS', p .. 'abort:' .. t) == 0
    and (origin == me or redis.call('EXISTS', p .. 'ins:' .. origin) == 1)
  if wanted and redis.call('SET', p .. 'claim:' .. t, me, 'NX', 'EX', ttl) then
    if origin ~= me then
      redis.call('RPUSH', p .. 'res:' .. origin, 'S' .. t .. '\\n' .. me)
      redis.call('EXPIRE', p .. 'res:' .. origin, ttl)
      redis.call('RPUSH', p .. 'bell:' .. origin, 1)
      redis.call('LTRIM', p .. 'bell:' .. origin, -1, -1)
      redis.call('EXPIRE', p .. 'bell:' .. origin, ttl)
    end
    return {t, origin, redis.call('HGET', p .. 'req:' .. t, 'body')}
  end
  if not wanted then redis.call('DEL', p .. 'req:' .. t) end
end
return false
"""

# append a result for origin ARGV[2] unless the ticket was aborted: 1 pushed, 0 aborted
_PUSH = """
local p, origin, t, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if redis.call('EXISTS', p .. 'abort:' .. t) == 1 then return 0 end
redis.call('RPUSH', p .. 'res:' .. origin, ARGV[5])
redis.call('EXPIRE', p .. 'res:' .. origin, ttl)
redis.call('RPUSH', p .. 'bell:' .. origin, 1)
redis.call('LTRIM', p .. 'bell:' .. origin, -1, -1)
redis.call('EXPIRE', p .. 'bell:' .. origin, ttl)
return 1
"""

# drop the first ARGV[1] results of list KEYS[1] once handled, if its entry ARGV[1] is still ARGV[2]
# (a retried acknowledgement whose first reply was lost drops nothing twice)
_ACK = """
local n = tonumber(ARGV[1])
if redis.call('LINDEX', KEYS[1], n - 1) == ARGV[2] then
  redis.call('LTRIM', KEYS[1], n, -1)
  return 1
end
return 0
"""


def _cancelling() -> bool:
    """Whether the current task has a cancel pending (``Task.cancelling``: Python 3.11+; on 3.10
    a swallowed cancel cannot be seen here)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False


class RedisStore:
    """One instance's view of a topic in Redis (async; one connection pool)."""

    def __init__(self, config: GlobalSchedulerConfig, name: str) -> None:
        self.config = config
        self.name = name
        self.prefix = f"fd:{config.topic}:"
        self.redis = aioredis.Redis(host=config.host, port=config.port, db=config.db, password=config.password,
                                    socket_connect_timeout=2.0, socket_timeout=10.0, health_check_interval=5)
        self._take = self.redis.register_script(_TAKE)
        self._push = self.redis.register_script(_PUSH)
        self._ack = self.redis.register_script(_ACK)
        self.down_since: float | None = None  # set while calls fail; for the log and the tests

    # ---- keys -------------------------------------------------------------------
    def key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    def shard_of(self, name: str) -> int:
        return zlib.crc32(name.encode()) % self.config.load_shards_num

    # ---- retrying ---------------------------------------------------------------
    async def retry(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()``, retried with backoff while Redis cannot be reached."""
        delay = BACKOFF_START
        while True:
            try:
                result = await call()
            except TRANSIENT as exc:
                if _cancelling():  # redis-py turns a cancel into a connection error
                    raise asyncio.CancelledError() from exc
                loop_time = asyncio.get_running_loop().time()
                if self.down_since is None:
                    self.down_since = loop_time
                    logger.warning("Redis %s:%d unreachable (%s: %s); retrying %s with backoff",
                                   self.config.host, self.config.port, type(exc).__name__, exc, what)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            if _cancelling():  # a cancel redis-py swallowed mid-call
                raise asyncio.CancelledError()
            if self.down_since is not None:
                logger.warning("Redis %s:%d reachable again", self.config.host, self.config.port)
                self.down_since = None
            return result

    # ---- membership and load ------------------------------------------------------
    async def claim_name(self) -> bool:
        """Register this instance's name; False if a live instance holds it."""
        ok = await self.redis.set(self.key("ins", self.name), "{}", nx=True, px=self.config.expire_period_ms)
        return bool(ok)

    async def heartbeat(self, load: dict[str, Any]) -> None:
        """Refresh this instance's heartbeat and its row in the load table."""
        score = load.get("running", 0) + load.get("waiting", 0) + load.get("queued", 0)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.key("ins", self.name), json.dumps(load), px=self.config.expire_period_ms)
            pipe.zadd(self.key("load", str(self.shard_of(self.name))), {self.name: score})
            await pipe.execute()

    async def leave(self) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(self.key("ins", self.name))
            pipe.zrem(self.key("load", str(self.shard_of(self.name))), self.name)
            await pipe.execute()

    async def members(self) -> list[str]:
        """Every instance of the topic in the load table (live or not)."""
        names: list[str] = []
        for shard in range(self.config.load_shards_num):
            found: list[bytes] = await self.redis.zrange(self.key("load", str(shard)), 0, -1)  # type: ignore[assignment]
            names += [m.decode() for m in found]
        return names

    async def alive(self, names: list[str]) -> dict[str, bool]:
        if not names:
            return {}
        found = await self.redis.mget([self.key("ins", n) for n in names])
        return {n: v is not None for n, v in zip(names, found)}

    async def load_of(self, name: str) -> dict[str, Any] | None:
        raw = await self.redis.get(self.key("ins", name))
        return None if raw is None else json.loads(raw)

    async def forget(self, name: str) -> None:
        """Drop a dead instance from the load table (its queue is drained by takers)."""
        await self.redis.zrem(self.key("load", str(self.shard_of(name))), name)

    async def server_run_id(self) -> str:
        """Changes when the Redis server restarts."""
        return str((await self.redis.info("server"))["run_id"])

    # ---- requests -----------------------------------------------------------------
    async def submit(self, ticket: str, body: bytes) -> None:
        """Queue a request this instance accepted (atomically: body, then ticket)."""
        ttl = self.config.ttl
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key("req", ticket), mapping={"origin": self.name, "body": body})
            pipe.expire(self.key("req", ticket), ttl)
            pipe.rpush(self.key("q", self.name), ticket)
            pipe.expire(self.key("q", self.name), ttl)
            await pipe.execute()

    async def exists(self, ticket: str) -> bool:
        return bool(await self.redis.exists(self.key("req", ticket)))

    async def queue_lengths(self, names: list[str]) -> dict[str, int]:
        if not names:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for n in names:
                pipe.llen(self.key("q", n))
            return dict(zip(names, await pipe.execute()))

    async def take(self, victim: str) -> tuple[str, str, bytes] | None:
        """The oldest live ticket of ``victim``'s queue, claimed for this instance:
        (ticket, origin, body), or None when there is none."""
        got = await self._take(args=[self.prefix, victim, self.name, self.config.ttl])
        if not got:
            return None
        ticket, origin, body = got
        return ticket.decode(), origin.decode(), body

    async def abort(self, ticket: str) -> None:
        """The accepting instance gives up a ticket: a taker skips it, an executor stops."""
        await self.redis.set(self.key("abort", ticket), "1", ex=self.config.ttl)

    async def aborted(self, ticket: str) -> bool:
        return bool(await self.redis.exists(self.key("abort", ticket)))

    async def finish(self, ticket: str) -> None:
        await self.redis.delete(self.key("req", ticket))

    # ---- results ------------------------------------------------------------------
    async def push_result(self, origin: str, ticket: str, entry: bytes) -> bool:
        """Append a result for ``origin``; False if the ticket was aborted."""
        return bool(await self._push(args=[self.prefix, origin, ticket, self.config.ttl, entry]))

    async def read_results(self, timeout: float, count: int = 256) -> list[bytes]:
        """The oldest of this instance's results, left in Redis until ``ack_results``
        (a destructive pop whose reply is lost in a Redis restart would lose them);
        when there are none, wait up to ``timeout`` for one."""
        key = self.key("res", self.name)
        got: list[bytes] = await self.redis.lrange(key, 0, count - 1)  # type: ignore[assignment]
        if got:
            return list(got)
        if await self.redis.blpop([self.key("bell", self.name)], timeout=timeout):
            got = await self.redis.lrange(key, 0, count - 1)  # type: ignore[assignment]
        return list(got)

    async def ack_results(self, entries: list[bytes]) -> None:
        """Drop ``entries``, the oldest results, which ``read_results`` gave and the caller handled."""
        if entries:
            await self._ack(keys=[self.key("res", self.name)], args=[len(entries), entries[-1]])

    async def close(self) -> None:
        await self.redis.aclose()
