"""Instances found in the global scheduler's Redis registry (``--scheduler-host``), read only.

An fd-serve with ``--scheduler-name global`` keeps a heartbeat in Redis
(``fd_core.cluster.store``: the topic's load table lists instance names,
``ins:<name>`` holds its live load and expires when it dies). Every
``--redis-poll-interval-secs`` the router reads the names whose heartbeat is
live and routes to them: at the ``url`` of their heartbeat when it has one,
else at ``http://<name>`` (fd-serve names an instance ``host:port`` of its
API). The router never writes to Redis. Started by the app's lifespan.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fd_core.router.config import RouterConfig, normalize_url
from fd_core.router.registry import ROLES, Registry

__all__ = ["RedisDiscovery", "url_of"]

logger = logging.getLogger("fd_core.router")


def url_of(name: str, load: dict[str, Any] | None) -> str | None:
    """The API URL of the instance called ``name`` with heartbeat ``load``; None when unknown."""
    for candidate in ((load or {}).get("url"), name):
        if isinstance(candidate, str):
            try:
                return normalize_url(candidate)
            except ValueError:
                continue
    return None


class RedisDiscovery:
    """Reads the live instances of one topic (the store API of fd_core.cluster, no writes)."""

    def __init__(self, config: RouterConfig) -> None:
        from fd_core.cluster.config import GlobalSchedulerConfig
        from fd_core.cluster.store import RedisStore

        self.config = config
        scheduler = GlobalSchedulerConfig(host=config.scheduler_host or "127.0.0.1", port=config.scheduler_port,
                                          db=config.scheduler_db, password=config.scheduler_password or None,
                                          topic=config.scheduler_topic,
                                          load_shards_num=config.scheduler_load_shards_num)
        self.store = RedisStore(scheduler, "fd-router")
        self._unnamed: set[str] = set()  # names without a usable URL, warned about once
        self.error: str | None = None  # the last failure to read Redis; None once it works

    async def found(self) -> dict[str, str | None]:
        """URL -> role (or None) of every instance whose heartbeat is live."""
        names = await self.store.members()
        alive = await self.store.alive(names)
        out: dict[str, str | None] = {}
        for name in names:
            if not alive.get(name):
                continue
            load = await self.store.load_of(name)
            url = url_of(name, load)
            if url is None:
                if name not in self._unnamed:
                    self._unnamed.add(name)
                    logger.warning("instance %r in Redis has no URL the router can use (its name is not "
                                   "host:port and its heartbeat has no 'url')", name)
                continue
            role = (load or {}).get("role")
            out[url] = role if role in ROLES else None
        return out

    async def run(self, registry: Registry) -> None:
        """Keep the registry's Redis instances current until cancelled."""
        while True:
            try:
                registry.sync(await self.found(), "redis")
                if self.error is not None:
                    logger.info("Redis %s:%d readable again", self.config.scheduler_host, self.config.scheduler_port)
                self.error = None
            except Exception as exc:  # Redis down: keep what we have, say so once
                if self.error is None:
                    logger.warning("cannot read instances from Redis %s:%d: %s: %s", self.config.scheduler_host,
                                   self.config.scheduler_port, type(exc).__name__, exc)
                self.error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(self.config.redis_poll_interval_secs)

    async def close(self) -> None:
        await self.store.close()
