"""The instance side of ``fd-serve --router HOST:PORT``: register with the router and keep registered.

Called by the server (``fd_core.entrypoints.serve``) once it listens: a
background task POSTs FastDeploy's instance info (``role``, ``host_ip``,
``port``) to the router's ``/register`` until it is accepted, then again
every ``REFRESH_SECS`` (so a restarted router learns the instance back; the
router takes a repeat as a no-op). A router that cannot be reached is
logged once per outage, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from urllib.parse import urlsplit

import httpx

from fd_core.router.config import normalize_url

__all__ = ["REFRESH_SECS", "announce_forever", "instance_info", "router_url"]

logger = logging.getLogger("fd_core.router")
REFRESH_SECS = 10.0
RETRY_SECS = 1.0


def router_url(value: str) -> str:
    """``--router`` (``host:port`` or ``http://host:port``) -> URL; ValueError naming the value."""
    return normalize_url(value, "--router")


def _reachable_address(router: str) -> str:
    """This host's address on the route to the router (for an instance listening on 0.0.0.0)."""
    parts = urlsplit(router)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((parts.hostname or "127.0.0.1", parts.port or 80))  # UDP: no packet is sent
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


def instance_info(router: str, host: str, port: int, role: str = "mixed") -> dict[str, object]:
    """FastDeploy's instance info for ``/register``."""
    host_ip = _reachable_address(router) if host in ("", "0.0.0.0", "::") else host
    return {"role": role, "host_ip": host_ip, "port": port}


async def announce_forever(router: str, info: dict[str, object]) -> None:
    """Register ``info`` with ``router`` and keep it registered until cancelled."""
    failing = False
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            try:
                resp = await client.post(router + "/register", json=info)
                ok, why = resp.status_code == 200, f"{resp.status_code} {resp.text[:300]}"
            except httpx.HTTPError as exc:
                ok, why = False, f"{type(exc).__name__}: {exc}"
            if ok and failing:
                logger.info("registered with the router %s as %s", router, info)
            elif not ok and not failing:
                logger.warning("cannot register with the router %s (%s); retrying", router, why)
            failing = not ok
            await asyncio.sleep(REFRESH_SECS if ok else RETRY_SECS)
