"""The instances the router knows, their health and their load.

Instances come from ``--instances``, from ``POST /register`` (fd-serve
``--router``) and from the global scheduler's Redis registry
(``fd_core.router.discovery``). ``Registry.run`` keeps them current: every
``--health-check-interval-secs`` a GET /health per instance (unhealthy after
``--health-failure-threshold`` failures in a row, healthy again after
``--health-success-threshold`` successes), every ``--load-poll-interval-secs``
a GET /load (role, running, waiting, free/total KV blocks, ``pd_addr``). The
proxy (``fd_core.router.proxy``) marks an instance unhealthy at once when it
cannot connect to it, and counts the requests it has open on each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from fd_core.router.config import RouterConfig

__all__ = ["ROLES", "Instance", "Registry"]

logger = logging.getLogger("fd_core.router")
ROLES = ("mixed", "prefill", "decode")


@dataclass
class Instance:
    """One fd-serve instance behind the router."""

    url: str  # http://host:port
    role: str = "mixed"  # as registered, then as its /load says
    source: str = "flag"  # flag | register | redis
    healthy: bool = True  # optimistic until the first check; a failed connect clears it at once
    failures: int = 0  # failed health checks in a row
    successes: int = 0  # good health checks in a row
    in_flight: int = 0  # requests the router has open on it now
    running: int = 0  # from its last /load
    waiting: int = 0
    external: int = 0  # of those, requests beyond the router's own count when it answered (other clients)
    free_blocks: int | None = None
    total_blocks: int | None = None
    pd_addr: str | None = None  # a prefill instance's KV-transfer address (its /load), for the decode side
    load_time: float = 0.0  # time.time() of its last /load answer; 0: never
    served: int = 0  # requests routed to it, total
    last_error: str | None = None

    @property
    def load(self) -> int:
        """Requests on it: the router's own count (exact, live) plus the work its last /load
        showed beyond that count (from other clients). Not the polled count itself: between two
        polls it goes stale, and every router then herds onto the instance that looked idle."""
        return self.in_flight + self.external

    def snapshot(self) -> dict[str, Any]:
        return {"url": self.url, "role": self.role, "source": self.source, "healthy": self.healthy,
                "in_flight": self.in_flight, "running": self.running, "waiting": self.waiting,
                "external": self.external,
                "free_blocks": self.free_blocks, "total_blocks": self.total_blocks, "pd_addr": self.pd_addr,
                "load_age_secs": None if not self.load_time else round(time.time() - self.load_time, 3),
                "served": self.served, "last_error": self.last_error}


class Registry:
    """The router's table of instances (one event loop; no locks needed)."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.instances: dict[str, Instance] = {}
        for url in config.instances:
            self.add(url, None, "flag")

    # ---- membership ----------------------------------------------------------------
    def add(self, url: str, role: str | None, source: str) -> Instance:
        """Add ``url`` (normalized) or update its role; returns its entry."""
        if role is not None and role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        inst = self.instances.get(url)
        if inst is None:
            inst = self.instances[url] = Instance(url, role or "mixed", source)
            logger.info("instance %s added (%s, role %s)", url, source, inst.role)
        elif role is not None:
            inst.role = role
        return inst

    def remove(self, url: str) -> None:
        if self.instances.pop(url, None) is not None:
            logger.info("instance %s removed", url)

    def usable(self, role: str) -> list[Instance]:
        """Healthy instances of ``role``; a prefill instance also needs its ``pd_addr``."""
        return [i for i in self.instances.values()
                if i.healthy and i.role == role and (role != "prefill" or i.pd_addr)]

    def counts(self) -> dict[str, int]:
        """FastDeploy's /registered_number: instances per role."""
        out = dict.fromkeys(ROLES, 0)
        for inst in self.instances.values():
            out[inst.role] += 1
        return out

    # ---- health --------------------------------------------------------------------
    def mark_failed(self, inst: Instance, why: str) -> None:
        """A request could not reach ``inst``: unhealthy now, until checks pass again."""
        inst.last_error, inst.successes = why, 0
        inst.failures = max(inst.failures, self.config.health_failure_threshold)
        if inst.healthy:
            inst.healthy = False
            logger.warning("instance %s marked unhealthy: %s", inst.url, why)

    def _record_check(self, inst: Instance, ok: bool, why: str | None) -> None:
        if ok:
            inst.failures, inst.successes = 0, inst.successes + 1
            if not inst.healthy and inst.successes >= self.config.health_success_threshold:
                inst.healthy, inst.last_error = True, None
                logger.info("instance %s healthy again", inst.url)
            return
        inst.successes, inst.failures, inst.last_error = 0, inst.failures + 1, why
        if inst.healthy and inst.failures >= self.config.health_failure_threshold:
            inst.healthy = False
            logger.warning("instance %s marked unhealthy after %d failed health checks: %s", inst.url,
                           inst.failures, why)

    async def check_health(self, client: httpx.AsyncClient, inst: Instance) -> bool:
        """One GET /health of ``inst``; updates its health; True when it answered 200."""
        try:
            resp = await client.get(inst.url + "/health", timeout=self.config.health_check_timeout_secs)
            ok, why = resp.status_code == 200, f"/health answered {resp.status_code}"
        except httpx.HTTPError as exc:
            ok, why = False, f"/health failed: {type(exc).__name__}: {exc}"
        self._record_check(inst, ok, None if ok else why)
        return ok

    async def poll_load(self, client: httpx.AsyncClient, inst: Instance) -> None:
        """One GET /load of ``inst``: its role and load (an instance without /load keeps its role)."""
        try:
            resp = await client.get(inst.url + "/load", timeout=self.config.health_check_timeout_secs)
            if resp.status_code != 200:
                return
            data = resp.json()
        except (httpx.HTTPError, ValueError):
            return
        if not isinstance(data, dict):
            return
        role = data.get("role")
        if role in ROLES and role != inst.role:
            logger.info("instance %s reports role %s (was %s)", inst.url, role, inst.role)
            inst.role = role
        inst.running, inst.waiting = _count(data.get("running")), _count(data.get("waiting"))
        inst.external = max(0, inst.running + inst.waiting - inst.in_flight)
        inst.free_blocks = _count(data["free_blocks"]) if "free_blocks" in data else None
        inst.total_blocks = _count(data["total_blocks"]) if "total_blocks" in data else None
        pd_addr = data.get("pd_addr")
        inst.pd_addr = pd_addr if isinstance(pd_addr, str) and pd_addr else None
        inst.load_time = time.time()

    # ---- the background loops --------------------------------------------------------
    async def run(self, client: httpx.AsyncClient) -> None:
        """Check health and poll load until cancelled (started by the app's lifespan)."""
        await asyncio.gather(self._every(self.config.health_check_interval_secs, self.check_health, client),
                             self._every(self.config.load_poll_interval_secs, self.poll_load, client))

    async def _every(self, interval: float, call: Any, client: httpx.AsyncClient) -> None:
        while True:
            started = time.monotonic()
            insts = list(self.instances.values())
            if insts:
                await asyncio.gather(*(call(client, i) for i in insts), return_exceptions=True)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    def sync(self, found: dict[str, str | None], source: str) -> None:
        """Make the instances of ``source`` exactly ``found`` (url -> role or None), as a
        registry read from Redis says; instances of other sources are left alone."""
        for url, role in found.items():
            if url not in self.instances or self.instances[url].source == source:
                self.add(url, role, source)
        for url in [u for u, i in self.instances.items() if i.source == source and u not in found]:
            self.remove(url)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
