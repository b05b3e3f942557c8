"""``/v1/models``, ``/tokenize``, ``/detokenize``, ``/health``, ``/version`` (vLLM's shapes),
``/ping`` and ``/config-info`` (FastDeploy's), ``/load`` (fd-router's poll)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

import fd_core
from fd_core.engine.client import EngineDeadError
from fd_core.entrypoints.openai.chat_prompt import render_chat, text_messages
from fd_core.entrypoints.openai.config_info import config_info, fallback_config_info
from fd_core.entrypoints.openai.errors import OpenAIError, error_response
from fd_core.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from fd_core.entrypoints.openai.tokenize_text import encode_text

__all__ = ["config_info", "misc_router"]


def _state(request: Request) -> Any:
    return request.app.state.fd


def misc_router() -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health(request: Request) -> Response:
        try:
            await _state(request).client.check_health()
        except EngineDeadError as exc:
            return error_response(f"The engine is not serving: {exc}", 503)
        return Response(status_code=200)

    # FastDeploy's (and SageMaker's) liveness probe: the same answer as /health
    router.add_api_route("/ping", health, methods=["GET"], name="ping")
    router.add_api_route("/ping", health, methods=["POST"], name="ping_post")

    @router.get("/load")
    async def load(request: Request) -> dict[str, Any]:
        """This instance's load, polled by fd-router (fd_core.router.registry): ``role``
        (``--splitwise-role``) and ``pd_addr`` (a prefill instance's KV-transfer address,
        ``fd_core.disagg.config.advertised_address``) as fd-serve set them on the app state."""
        st = _state(request)
        stats, info = st.client.stats(), st.client.info
        total = max(0, info.num_kv_blocks - 1)  # block 0 is the null block
        return {"role": st.splitwise_role, "running": stats.num_running,
                "waiting": stats.num_waiting + stats.num_enqueued,
                "free_blocks": stats.num_free_blocks if stats.time else total, "total_blocks": total,
                "pd_addr": st.pd_addr}

    @router.get("/config-info")
    async def config(request: Request) -> dict[str, Any]:
        return current_config_info(request.app)

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": fd_core.__version__}

    @router.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        st = _state(request)
        created = int(st.started)
        data = [{"id": name, "object": "model", "created": created, "owned_by": "fd-core",
                 "root": st.client.info.model_dir, "parent": None, "max_model_len": st.max_model_len}
                for name in st.served_model_names]
        return {"object": "list", "data": data}

    @router.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> dict[str, Any]:
        st = _state(request)
        if model not in st.served_model_names:
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "model")
        return {"id": model, "object": "model", "created": int(st.started), "owned_by": "fd-core",
                "root": st.client.info.model_dir, "parent": None, "max_model_len": st.max_model_len}

    async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
        st = _state(request)
        st.chat.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise OpenAIError("give exactly one of prompt or messages", 400, "prompt")
        if body.messages is not None:
            tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
            messages, encode = text_messages([m.model_dump(exclude_none=True) for m in body.messages]), None
            if st.chat.literal is not None:  # --escape-special-tokens: count what chat would generate from
                messages, found, nonce = st.chat.literal.escape(messages)
                encode = st.chat.literal.encoder(found, nonce)
            text = render_chat(st.tokenizer, messages, body.add_generation_prompt, tools,
                               body.chat_template_kwargs, st.chat.chat_template)
        else:
            text, encode = body.prompt or "", None
        tokens = await encode_text(st.tokenizer, text, st.max_model_len, "messages" if body.messages else "prompt",
                                   encode)
        out: dict[str, Any] = {"count": len(tokens), "max_model_len": st.max_model_len, "tokens": tokens}
        if body.return_token_strs:
            out["token_strs"] = [st.chat.token_text(t) for t in tokens]
        return out

    async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
        st = _state(request)
        st.chat.check_model(body.model)
        st.chat.check_token_ids(body.tokens, "tokens")
        return {"prompt": st.tokenizer.decode(body.tokens)}

    for path in ("/tokenize", "/v1/tokenize"):
        router.add_api_route(path, tokenize, methods=["POST"])
    for path in ("/detokenize", "/v1/detokenize"):
        router.add_api_route(path, detokenize, methods=["POST"])
    return router


def current_config_info(app: Any) -> dict[str, Any]:
    """``/config-info`` of the app (also served on ``--metrics-port``, as FastDeploy does):
    the configuration the server stored, with what the running engine chose."""
    st = app.state.fd
    stored = getattr(app.state, "config_info", None)
    out = dict(stored) if stored is not None else fallback_config_info(st)
    out["engine"] = dataclasses.asdict(st.client.info)  # what the running engine chose
    out.setdefault("served_model_names", list(st.served_model_names))
    out.setdefault("max_model_len", st.max_model_len)
    return out
