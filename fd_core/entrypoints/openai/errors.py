"""OpenAI-style error objects and the app's exception handlers.

Every error answer has vLLM's shape (which the openai client parses):
``{"error": {"message": ..., "type": "BadRequestError", "param": ..., "code": 400}}``
where ``type`` is the openai client's exception class for the status and
``code`` the HTTP status. Bad input is a 4xx that names the problem; only a
bug in this layer is a 500, and it is logged with its traceback.
"""

from __future__ import annotations

import json
import logging
import re
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fd_core.engine.client import EngineDeadError, RequestError

__all__ = ["OpenAIError", "error_body", "error_response", "install_error_handlers"]

logger = logging.getLogger("fd_core.entrypoints.openai")

# HTTP status -> the openai client's exception class name
_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    """An error answered to the client: status, message and the offending parameter."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.headers = headers


def error_body(message: str, status: int = 400, param: str | None = None) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(message: str, status: int = 400, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status, headers=headers)


# pydantic names union members in error locations ("str", "list[int]", "StreamOptions",
# "function-after[...]"); field names are snake_case, so these are told apart
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|literal\[.*|function-.*|\w+\[.*\]|[A-Z]\w*)$")


def _loc_name(loc: tuple[Any, ...]) -> str:
    """``("body", "messages", 0, "role")`` -> ``messages[0].role``."""
    out = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _UNION_TAG.match(str(part)):
            out += ("." if out else "") + str(part)
    return out


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """A readable message naming each bad field, and the first field's name."""
    problems: dict[str, list[str]] = {}  # field -> what is wrong with it (union members give several)
    inputs: dict[str, Any] = {}
    unknown: list[str] = []  # fields the request model does not declare (values never echoed)
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            return f"The request body is not valid JSON: {ctx.get('error', err.get('msg'))}", None
        name = _loc_name(tuple(err.get("loc", ())))
        if err.get("type") == "extra_forbidden":
            unknown.append(name)
            continue
        msgs = problems.setdefault(name, [])
        if err.get("msg") not in msgs:
            msgs.append(str(err.get("msg")))
        if err.get("type") != "missing":
            inputs.setdefault(name, err.get("input"))
    if unknown:
        names = ", ".join(f"'{n}'" for n in unknown[:8])
        one = len(unknown) == 1
        return (f"Unknown field{'' if one else 's'} {names} in the request body; fd-core does not "
                f"support {'it' if one else 'them'}"), unknown[0]
    if not problems:
        return "Invalid request", None
    parts = []
    for name, msgs in list(problems.items())[:6]:
        got = f" (got {json.dumps(inputs[name], default=str)[:80]})" if name in inputs else ""
        text = " or ".join(msgs[:4])
        parts.append(f"{name}: {text}{got}" if name else f"{text}{got}")
    first = next(iter(problems)) or None
    return "Invalid request: " + "; ".join(parts), first


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc.message, exc.status, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(message, 400, param)

    @app.exception_handler(RequestError)
    async def _refused(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(str(exc), 400)

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        logger.error("engine is dead: %s", exc)
        return error_response(f"The engine is not serving: {exc}", 503)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return error_response(message, exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s %s", request.method, request.url.path)
        return error_response(f"Internal server error: {type(exc).__name__}: {exc}", 500)
