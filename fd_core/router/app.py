"""``build_app(config)``: fd-router's FastAPI app.

Routes: ``POST /v1/chat/completions`` and ``/v1/completions`` (forwarded,
``fd_core.router.proxy``), ``GET /v1/models`` (from a usable instance),
``GET /health`` (200 while a request can be routed, else 503 saying why),
FastDeploy's router routes ``POST /register`` (an instance registers itself:
FastDeploy's instance info ``{"role", "host_ip", "port", ...}`` or
``{"url", "role"}``), ``GET /registered`` (every instance with its health and
load; ``/instances`` is the same), ``GET /registered_number`` and ``GET /metrics``
(Prometheus text: per instance its health, requests in flight and requests routed). The app's
lifespan runs the registry's health and load polling and, with
``--scheduler-host``, the Redis discovery. Called by ``fd_core.router.cli``
and by tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from fd_core.router.config import RouterConfig, normalize_url
from fd_core.router.discovery import RedisDiscovery
from fd_core.router.proxy import Proxy, error_response
from fd_core.router.registry import ROLES, Registry

__all__ = ["build_app", "instance_url_of"]


def instance_url_of(info: Any) -> tuple[str, str]:
    """(URL, role) of a /register body; ValueError naming what is wrong."""
    if not isinstance(info, dict):
        raise ValueError(f"the body must be a JSON object with role, host_ip and port (or url), got {info!r}")
    role = info.get("role", "mixed")
    role = role.lower() if isinstance(role, str) else role
    if role not in ROLES:
        raise ValueError(f"role {info.get('role')!r} is not one of {', '.join(ROLES)}")
    if "url" in info:
        return normalize_url(str(info["url"]), "url"), role
    if "host_ip" not in info or "port" not in info:
        raise ValueError("the body needs host_ip and port (FastDeploy's instance info) or url")
    return normalize_url(f"{info['host_ip']}:{info['port']}", "host_ip:port"), role


def build_app(config: RouterConfig, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The router app; ``transport`` replaces the network (tests)."""
    registry = Registry(config)
    timeout = httpx.Timeout(config.request_timeout_secs, connect=config.health_check_timeout_secs)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    client = httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport)
    proxy = Proxy(config, registry, client)
    discovery = RedisDiscovery(config) if config.redis_discovery else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(registry.run(client))]
        if discovery is not None:
            tasks.append(asyncio.create_task(discovery.run(registry)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if discovery is not None:
                await discovery.close()
            await client.aclose()

    app = FastAPI(title="fd-router", lifespan=lifespan)
    app.state.registry, app.state.proxy, app.state.discovery = registry, proxy, discovery

    async def generate(request: Request) -> Response:
        body = await request.body()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None  # the instance answers the 400
        return await proxy.forward("POST", request.url.path, body, request.headers, parsed)

    for path in ("/v1/chat/completions", "/v1/completions"):
        app.add_api_route(path, generate, methods=["POST"])

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await proxy.forward("GET", "/v1/models", None, request.headers)

    @app.get("/health")
    async def health() -> Response:
        roles = ("prefill", "decode") if config.splitwise else ("mixed",)
        missing = [proxy._unusable(r) for r in roles if not registry.usable(r)]
        if missing:
            return error_response("the router cannot route a request now: " + "; ".join(missing), 503)
        return JSONResponse({"status": "ok", **{r: len(registry.usable(r)) for r in roles}})

    @app.post("/register")
    async def register(request: Request) -> Response:
        try:
            url, role = instance_url_of(json.loads(await request.body() or b"null"))
        except ValueError as exc:
            return error_response(f"cannot register: {exc}", 400)
        if (role == "mixed") == config.splitwise:
            want = "prefill or decode (this router runs with --splitwise)" if config.splitwise else \
                "mixed (start the router with --splitwise for prefill/decode instances)"
            return error_response(f"cannot register {url}: its role is {role}, this router takes {want}", 400)
        known = url in registry.instances
        inst = registry.add(url, role, "register")
        if not await registry.check_health(client, inst):
            if not known:
                registry.remove(url)
            return error_response(f"cannot register {url}: it is not healthy ({inst.last_error})", 400)
        await registry.poll_load(client, inst)
        return JSONResponse({"status": "success", "url": url, "role": inst.role})

    async def registered() -> dict[str, Any]:
        return {"splitwise": config.splitwise,
                "redis": None if discovery is None else {"topic": config.scheduler_topic, "error": discovery.error},
                "instances": [i.snapshot() for i in registry.instances.values()]}

    for path in ("/registered", "/instances"):
        app.add_api_route(path, registered, methods=["GET"])

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(_prometheus(registry), media_type="text/plain; version=0.0.4")

    @app.get("/registered_number")
    async def registered_number() -> dict[str, int]:
        return registry.counts()

    return app


def _prometheus(registry: Registry) -> str:
    """The router's /metrics: one sample per instance and gauge."""
    lines = []
    for name, kind, text, value in (
            ("fd_router_instance_healthy", "gauge", "1 while the instance is healthy", lambda i: int(i.healthy)),
            ("fd_router_instance_in_flight", "gauge", "requests the router has open on it", lambda i: i.in_flight),
            ("fd_router_instance_load", "gauge", "its load as the policies see it", lambda i: i.load),
            ("fd_router_requests_total", "counter", "requests routed to it (attempts)", lambda i: i.served)):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{url="{i.url}",role="{i.role}"}} {value(i)}' for i in registry.instances.values()]
    return "\n".join(lines) + "\n"
