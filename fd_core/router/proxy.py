"""Forwarding one request to an instance, with retries and streaming pass-through.

``Proxy.forward`` is called by the app's routes (``fd_core.router.app``). For
each attempt it picks an instance (``fd_core.router.policy``): a mixed one,
or with ``--splitwise`` a decode instance plus a prefill instance, whose
``pd_addr`` goes to the decode instance in the ``x-fd-prefill-addr`` header
(the decode instance has that prefill instance run the prompt and send it
the KV cache). A request that never reached an instance (no connection, or
an answer of 503 or 429 before any byte: refused, not run) is tried on
another one, up to ``--max-attempts``; an instance that cannot be connected
to, or answers 503, is marked unhealthy at once. Anything else is the
instance's answer and passes through: status and body, or the SSE stream
chunk by chunk. A stream that breaks after bytes went to the client ends
with an SSE error event and ``data: [DONE]``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fd_core.router.config import RouterConfig
from fd_core.router.policy import Picker, prefix_keys
from fd_core.router.registry import Instance, Registry

__all__ = ["PREFILL_HEADER", "INSTANCE_HEADER", "Proxy", "error_body", "error_response", "prompt_text"]

logger = logging.getLogger("fd_core.router")
PREFILL_HEADER = "x-fd-prefill-addr"  # the prefill instance's pd_addr, for the decode instance (issue 18)
INSTANCE_HEADER = "x-fd-instance"  # on the router's answer: the instance that served it
RETRY_STATUSES = (503, 429)  # refused before running: try another instance
_FORWARDED = ("authorization", "content-type", "accept", "x-request-id")
_RETURNED = ("content-type", "x-request-id", "retry-after")


def error_body(message: str, status: int) -> dict[str, Any]:
    """An OpenAI-style error object (the shape fd-serve answers with)."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 502: "BadGatewayError",
            503: "ServiceUnavailableError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def error_response(message: str, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, status), status_code=status)


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def prompt_text(body: Any) -> str:
    """The text a request's prompt starts with, for cache affinity: the messages (role and text
    parts) of a chat request, the prompt (or the first one) of a completion request."""
    if not isinstance(body, dict):
        return ""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
            parts.append(f"{m.get('role', '')}\x1f{content if isinstance(content, str) else ''}\x1e")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = " ".join(map(str, prompt)) if isinstance(prompt[0], int) else prompt[0]
        if isinstance(prompt, list):  # a batch of token-id lists
            prompt = " ".join(map(str, prompt))
    return prompt if isinstance(prompt, str) else ""


class NoInstance(Exception):
    """No usable instance for a request (the message says which and why)."""


class Proxy:
    """Picks instances and forwards requests to them over one ``httpx.AsyncClient``."""

    def __init__(self, config: RouterConfig, registry: Registry, client: httpx.AsyncClient) -> None:
        self.config = config
        self.registry = registry
        self.client = client
        self.pickers = {role: Picker(policy, config.balance_abs_threshold, config.balance_rel_threshold)
                        for role, policy in (("mixed", config.policy), ("prefill", config.prefill_policy),
                                             ("decode", config.decode_policy))}

    # ---- choosing ------------------------------------------------------------------
    def _unusable(self, role: str) -> str:
        known = [i for i in self.registry.instances.values() if i.role == role]
        if not known:
            return f"no {role} instance is registered"
        why = "; ".join(f"{i.url}: " + ("no pd_addr in its /load yet" if i.healthy else f"unhealthy "
                                         f"({i.last_error or 'failed health checks'})") for i in known)
        return f"no usable {role} instance ({why})"

    def choose(self, keys: Sequence[bytes], tried: set[str]) -> tuple[Instance, Instance | None]:
        """(the instance to send to, the prefill instance or None), avoiding ``tried``."""
        role = "decode" if self.config.splitwise else "mixed"
        usable = self.registry.usable(role)
        fresh = [i for i in usable if i.url not in tried]
        if not fresh:
            raise NoInstance(self._unusable(role) if not usable else
                             f"every usable {role} instance was tried ({', '.join(sorted(tried))})")
        target = self.pickers[role].pick(fresh, keys)
        if not self.config.splitwise:
            return target, None
        prefills = self.registry.usable("prefill")
        if not prefills:
            raise NoInstance(self._unusable("prefill"))
        prefill = self.pickers["prefill"].pick([p for p in prefills if p.url not in tried] or prefills, keys)
        return target, prefill

    # ---- forwarding ----------------------------------------------------------------
    async def forward(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str],
                      parsed: Any = None) -> Response:
        """Send the request to an instance (retrying as the module says) and relay its answer."""
        keys = prefix_keys(prompt_text(parsed), self.config.cache_prefix_chars) if parsed is not None else []
        sent = {k: v for k, v in headers.items() if k.lower() in _FORWARDED}
        tried: set[str] = set()
        errors: list[str] = []
        refused: tuple[int, bytes, dict[str, str]] | None = None
        for _ in range(self.config.max_attempts):
            try:
                target, prefill = self.choose(keys, tried)
            except NoInstance as exc:
                if refused is not None:
                    break
                return error_response(f"{exc}" + (f"; tried: {'; '.join(errors)}" if errors else ""), 503)
            tried.add(target.url)
            if prefill is not None:
                tried.add(prefill.url)
            extra = {PREFILL_HEADER: prefill.pd_addr or ""} if prefill is not None else {}
            release = self._hold(target, prefill)
            request = self.client.build_request(method, target.url + path, content=body, headers={**sent, **extra})
            try:
                resp = await self.client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                release(True)
                self.registry.mark_failed(target, f"cannot connect: {type(exc).__name__}: {exc}")
                errors.append(f"{target.url}: cannot connect ({exc})")
                continue
            except httpx.HTTPError as exc:  # it had the request: not retried (it may have run it)
                release(True)
                target.last_error = f"{type(exc).__name__}: {exc}"
                return error_response(f"instance {target.url} failed before answering: "
                                      f"{type(exc).__name__}: {exc}", 502)
            except BaseException:  # cancelled (the client or the router went away): uncount it
                release(True)
                raise
            if resp.status_code in RETRY_STATUSES:
                try:
                    text = await resp.aread()
                except httpx.HTTPError:
                    text = b""
                finally:
                    await resp.aclose()
                    release(True)
                if resp.status_code == 503:
                    self.registry.mark_failed(target, f"answered 503: {text[:200].decode(errors='replace')}")
                errors.append(f"{target.url}: {resp.status_code}")
                refused = (resp.status_code, text, self._returned(resp, target, prefill))
                continue
            return await self._relay(resp, target, prefill, release)
        if refused is not None:  # every attempt refused: the last instance's answer
            status, text, out_headers = refused
            return Response(text, status_code=status, headers=out_headers)
        return error_response(f"no instance could be reached after {len(errors)} attempt(s): "
                              f"{'; '.join(errors)}", 503)

    def _hold(self, target: Instance, prefill: Instance | None) -> Callable[[bool], None]:
        """Count the request on its instances; the returned ``release(all)`` uncounts the prefill
        instance (its part is done once the answer's first bytes arrive) or, with all=True, both."""
        target.in_flight += 1
        target.served += 1
        if prefill is not None:
            prefill.in_flight += 1
            prefill.served += 1
        state = {"prefill": prefill is not None, "target": True}

        def release(everything: bool) -> None:
            if state["prefill"] and prefill is not None:
                prefill.in_flight -= 1
                state["prefill"] = False
            if everything and state["target"]:
                target.in_flight -= 1
                state["target"] = False
        return release

    @staticmethod
    def _returned(resp: httpx.Response, target: Instance, prefill: Instance | None) -> dict[str, str]:
        out = {k: v for k, v in resp.headers.items() if k.lower() in _RETURNED and k.lower() != "content-type"}
        out[INSTANCE_HEADER] = target.url
        if prefill is not None:
            out["x-fd-prefill-instance"] = prefill.url
        return out

    async def _relay(self, resp: httpx.Response, target: Instance, prefill: Instance | None,
                     release: Callable[[bool], None]) -> Response:
        out_headers = self._returned(resp, target, prefill)
        media = resp.headers.get("content-type")
        if resp.status_code == 200 and (media or "").startswith("text/event-stream"):
            out_headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return StreamingResponse(self._stream(resp, target, release), media_type=media, headers=out_headers)
        try:
            content = await resp.aread()
        except httpx.HTTPError as exc:
            return error_response(f"instance {target.url} failed while answering: {type(exc).__name__}: {exc}",
                                  502)
        finally:
            await resp.aclose()
            release(True)
        return Response(content, status_code=resp.status_code, headers=out_headers, media_type=media)

    async def _stream(self, resp: httpx.Response, target: Instance,
                      release: Callable[[bool], None]) -> AsyncIterator[bytes]:
        tail = b"\n\n"  # the last two bytes sent: an error event must start on an event boundary
        try:
            async for chunk in resp.aiter_bytes():
                release(False)
                if chunk:
                    tail = (tail + chunk)[-2:]
                    yield chunk
        except httpx.HTTPError as exc:
            logger.warning("instance %s failed mid-stream: %s: %s", target.url, type(exc).__name__, exc)
            target.last_error = f"failed mid-stream: {type(exc).__name__}: {exc}"
            yield (b"" if tail == b"\n\n" else b"\n\n") + _sse(error_body(
                f"instance {target.url} failed while streaming: {type(exc).__name__}: {exc}", 502)) \
                + b"data: [DONE]\n\n"
        finally:
            await resp.aclose()
            release(True)
