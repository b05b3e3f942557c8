"""``build_app(client, server_args)``: the OpenAI-compatible FastAPI app over an EngineClient.

The CLI (``fd_core.entrypoints.cli``) builds the engine client and the
``ServerArgs`` from its flags, calls ``build_app`` and serves the result
with uvicorn; with ``--metrics-port`` it also serves ``build_metrics_app``
on that port, and /metrics leaves the main app.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

import fd_core
from fd_core.engine.client import EngineClient
from fd_core.entrypoints.openai.body_limit import (
    BODY_TIMEOUT_SECONDS,
    BodyLimitMiddleware,
    default_max_body_bytes,
)
from fd_core.entrypoints.openai.chat_parsing import resolve_parser
from fd_core.entrypoints.openai.concurrency import ConcurrencyLimit, ConcurrencyLimitMiddleware
from fd_core.entrypoints.openai.errors import error_response, install_error_handlers
from fd_core.entrypoints.openai.literal_tokens import LiteralSpecialTokens
from fd_core.entrypoints.openai.mm_content import MultiModalChat
from fd_core.entrypoints.openai.prefill_header import PrefillAddrMiddleware
from fd_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from fd_core.entrypoints.openai.serving_chat import OpenAIServingChat
from fd_core.entrypoints.openai.serving_completion import OpenAIServingCompletion
from fd_core.entrypoints.openai.serving_misc import misc_router
from fd_core.metrics import Metrics
from fd_core.tokenizer.chat_template import load_chat_template

__all__ = ["ServerArgs", "build_app", "build_metrics_app"]

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
# with an API key these need it; /health, /ping, /version and /metrics stay open
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/config-info", "/docs", "/redoc", "/openapi.json")


@dataclass(frozen=True)
class ServerArgs:
    """What the HTTP layer needs from the command line (FastDeploy's flag names)."""

    served_model_names: tuple[str, ...] = ()  # --served-model-name; empty: the model directory
    # --api-key (repeatable) / FD_API_KEY="k1,k2": any of them opens /v1/*, /tokenize, /detokenize
    api_keys: tuple[str, ...] = ()
    api_key: str | None = None  # one more key (the former single-key field); merged into api_keys
    max_concurrency: int | None = None  # --max-concurrency: engine requests (sequences) in flight; more get 429
    reasoning_parser: str | None = None  # --reasoning-parser, e.g. ernie_x1
    tool_call_parser: str | None = None  # --tool-call-parser, e.g. ernie_x1
    metrics_port: int | None = None  # --metrics-port: /metrics on its own app (build_metrics_app)
    max_model_len: int | None = None  # default: the engine's
    chat_template: str | None = None  # --chat-template: a .jinja path or the template text
    # False (--disallow-request-chat-template): a request's own chat_template is a 400
    allow_request_chat_template: bool = True
    tool_parser_plugin: str | None = None  # --tool-parser-plugin FILE: run before parsers are resolved
    log_requests: bool = True  # --disable-log-requests turns off the INFO line per request
    fastapi_docs: bool = True  # False (--disable-fastapi-docs): no /docs, /redoc, /openapi.json
    max_logprobs: int = 20  # --max-logprobs: top logprobs a request may ask for (the engine checks too)
    # --max-request-body-bytes: larger bodies get 413 (None: default_max_body_bytes(max_model_len))
    max_request_body_bytes: int | None = None
    request_body_timeout: float = BODY_TIMEOUT_SECONDS  # a body not complete by then gets 408
    max_waiting_time: float | None = None  # --max-waiting-time: seconds to the first output, else 408
    # --escape-special-tokens: special-token strings in user/tool content are text, never control tokens
    escape_special_tokens: bool = False
    enable_mm: bool = False  # --enable-mm: a text model is then an error (a VL model is multimodal anyway)
    mm_options: Any = None  # fd_core.multimodal.options.MultiModalOptions (--limit-mm-per-prompt, ...)
    extra: dict[str, Any] = field(default_factory=dict)  # room for flags this layer ignores

    def __post_init__(self) -> None:
        keys = (self.api_keys,) if isinstance(self.api_keys, str) else tuple(self.api_keys)
        if self.api_key is not None:
            keys += (self.api_key,)
        for key in keys:
            if not isinstance(key, str) or not key:
                raise ValueError(f"--api-key must be a non-empty string, got {key!r}")
        object.__setattr__(self, "api_keys", tuple(dict.fromkeys(keys)))  # frozen: normalised once, here
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if self.max_request_body_bytes is not None and self.max_request_body_bytes < 1024:
            raise ValueError(f"--max-request-body-bytes must be >= 1024, got {self.max_request_body_bytes}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"--max-model-len must be >= 2, got {self.max_model_len}")


@dataclass
class AppState:
    """Everything the route handlers share, as ``app.state.fd``."""

    client: EngineClient
    tokenizer: Any
    served_model_names: list[str]
    max_model_len: int
    metrics: Metrics
    chat: OpenAIServingChat
    completion: OpenAIServingCompletion
    started: float
    splitwise_role: str = "mixed"  # --splitwise-role (fd_core.disagg), reported by /load
    pd_addr: str | None = None  # a prefill instance's KV-transfer address, reported by /load


class SSEResponse(StreamingResponse):
    """Server-sent events that always close their generator, so a client that goes
    away aborts its request whichever way the server notices (cancel or send error)."""

    def __init__(self, events: AsyncIterator[str]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


class APIKeyMiddleware:
    """401 for protected paths without ``Authorization: Bearer <key>`` for one of ``api_keys``
    (each compared in constant time, all of them every time)."""

    def __init__(self, app: ASGIApp, api_keys: tuple[str, ...]) -> None:
        self.app = app
        self.expected = [f"Bearer {key}".encode() for key in api_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] != "OPTIONS"
                and scope["path"].startswith(PROTECTED_PREFIXES)):
            given = dict(scope["headers"]).get(b"authorization", b"")
            matches = [secrets.compare_digest(given, expected) for expected in self.expected]
            if not any(matches):
                response = error_response(
                    "Unauthorized: this server needs an API key, sent as 'Authorization: Bearer <key>'"
                    if not given else "Unauthorized: the API key is not valid", 401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(client: EngineClient, server_args: ServerArgs | None = None) -> FastAPI:
    """The OpenAI-compatible app over ``client``.

    Raises ValueError for a bad server argument (an unknown parser name, an
    unreadable chat template) so the CLI can report it before serving.
    """
    args = server_args or ServerArgs()
    names = list(args.served_model_names) or [client.info.model_dir]
    max_model_len = args.max_model_len or client.info.max_model_len
    chat_template = load_chat_template(args.chat_template) if args.chat_template else None
    if not args.log_requests:  # our INFO line per request, and uvicorn's access line
        logging.getLogger("fd_core.entrypoints.openai").setLevel(logging.WARNING)
        logging.getLogger("uvicorn.access").disabled = True  # a level would be reset by uvicorn.Config
    if args.tool_parser_plugin:
        from fd_core.parsers import ToolParserManager

        ToolParserManager.import_tool_parser(args.tool_parser_plugin)  # registers its parsers before they are looked up
    reasoning_cls = resolve_parser("reasoning", args.reasoning_parser)
    tool_cls = resolve_parser("tool-call", args.tool_call_parser)
    metrics = Metrics(stats=client.stats, info=client.info)

    docs: dict[str, Any] = {} if args.fastapi_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="fd-core OpenAI-compatible server", version=fd_core.__version__, **docs)
    app.state.fd = AppState(
        client=client, tokenizer=client.tokenizer, served_model_names=names, max_model_len=max_model_len,
        metrics=metrics,
        chat=OpenAIServingChat(client, names, max_model_len, metrics, reasoning_cls, tool_cls, chat_template,
                               args.allow_request_chat_template),
        completion=OpenAIServingCompletion(client, names, max_model_len, metrics),
        started=time.time(),
    )
    app.state.fd.chat.max_logprobs = app.state.fd.completion.max_logprobs = args.max_logprobs
    app.state.fd.chat.max_waiting_time = app.state.fd.completion.max_waiting_time = args.max_waiting_time
    app.state.fd.chat.mm = MultiModalChat.for_model(client.info.model_dir, args.mm_options, args.enable_mm)
    if args.escape_special_tokens:
        app.state.fd.chat.literal = LiteralSpecialTokens(client.tokenizer)
    install_error_handlers(app)
    app.include_router(misc_router())

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _respond(request, request.app.state.fd.chat.create(body))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _respond(request, request.app.state.fd.completion.create(body))

    if args.metrics_port is None:
        app.add_api_route("/metrics", _metrics_endpoint(metrics), methods=["GET"], include_in_schema=False)
    if args.max_concurrency is not None:
        app.state.concurrency = ConcurrencyLimit(args.max_concurrency)
        app.add_middleware(ConcurrencyLimitMiddleware, limit=app.state.concurrency, paths=GENERATION_PATHS)
    app.add_middleware(PrefillAddrMiddleware)  # x-fd-prefill-addr: the router's prefill instance (fd_core.disagg)
    # outside the concurrency limit: it counts only requests whose body has fully arrived
    app.add_middleware(BodyLimitMiddleware, timeout=args.request_body_timeout,
                       max_bytes=args.max_request_body_bytes or default_max_body_bytes(max_model_len))
    if args.api_keys:
        app.add_middleware(APIKeyMiddleware, api_keys=args.api_keys)  # outermost: 401 before 429
    return app


async def _respond(request: Request, work: Awaitable[dict[str, Any] | AsyncIterator[str]]) -> Response:
    """Run a handler, cancelling it (which aborts its engine requests) if the
    client disconnects before the answer starts, as vLLM's ``with_cancellation``."""
    handler = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not handler.done():
            handler.cancel()
    if not handler.done() or handler.cancelled():
        return Response(status_code=499)  # nobody is listening any more
    result = handler.result()
    return JSONResponse(result) if isinstance(result, dict) else SSEResponse(result)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _metrics_endpoint(metrics: Metrics) -> Any:
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    return metrics_endpoint


def build_metrics_app(app: FastAPI) -> FastAPI:
    """A tiny app serving ``/metrics`` and ``/config-info`` of ``app`` (for
    ``--metrics-port``, where FastDeploy serves both; secrets in the config are masked)."""
    from fd_core.entrypoints.openai.serving_misc import current_config_info

    async def config_info() -> dict[str, Any]:
        return current_config_info(app)

    metrics_app = FastAPI(title="fd-core metrics", openapi_url=None, docs_url=None, redoc_url=None)
    metrics_app.add_api_route("/metrics", _metrics_endpoint(app.state.fd.metrics), methods=["GET"])
    metrics_app.add_api_route("/config-info", config_info, methods=["GET"])
    return metrics_app


if __name__ == "__main__":  # python -m fd_core.entrypoints.openai.api_server: the same server as fd-serve
    import sys

    from fd_core.entrypoints.cli import serve_main

    sys.exit(serve_main())
