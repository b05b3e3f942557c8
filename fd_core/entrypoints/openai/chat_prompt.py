"""The prompt of a chat request: its token ids, from messages or as given.

In order (FastDeploy's precedence):
- ``prompt_token_ids`` (non-empty): used as they are; no template, messages unused;
- ``disable_chat_template``: the single message's text, tokenized, no template;
- otherwise the chat template: the request's own ``chat_template`` (text only,
  never a path; refused when the server runs with
  ``--disallow-request-chat-template``), else the server's ``--chat-template``,
  else the tokenizer's. A request's template is untrusted: it renders in a
  subprocess with time and memory limits, in a restricted sandbox
  (template_sandbox.py); the server's and the tokenizer's render here.
``completion_token_ids`` are then appended (an answer the model continues).

Message content may be a string or a list of parts: ``text`` parts are joined
(no separator, as ERNIE's template does); a part a text model cannot take
(``image_url``, ``video_url``, ``input_audio``, ``file``, an unknown type) is a
400 naming the part's type and the message, never dropped.
"""

from __future__ import annotations

from typing import Any

from fd_core.entrypoints.openai.errors import OpenAIError
from fd_core.entrypoints.openai.literal_tokens import UNTRUSTED_ROLES, LiteralSpecialTokens
from fd_core.entrypoints.openai.template_sandbox import (
    RenderError,
    RenderLimitError,
    RequestTemplateRenderer,
    shared_renderer,
)
from fd_core.entrypoints.openai.tokenize_text import encode_text

__all__ = ["chat_prompt_ids", "message_text", "render_chat", "render_request_chat", "text_messages"]

# apply_chat_template's own parameters: never taken from chat_template_kwargs
_RESERVED_TEMPLATE_KWARGS = {"messages", "add_generation_prompt", "tools", "tokenize", "chat_template"}
_MEDIA_PARTS = {"image_url", "image", "video_url", "video", "input_audio", "audio_url", "audio", "file",
                "input_image", "input_file"}


def message_text(content: Any, index: int) -> str | None:
    """The text of message ``index``'s content (parts joined); 400 for a part that is not text."""
    if content is None or isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type")
        where = f"messages[{index}].content[{j}]"
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in _MEDIA_PARTS:
            raise OpenAIError(f"{where} is a content part of type '{kind}', which needs a multimodal model; "
                              "this server serves a text model and takes only 'text' parts", 400, where)
        elif kind == "text":
            raise OpenAIError(f"{where} is a 'text' part without a string 'text'", 400, where)
        else:
            raise OpenAIError(f"{where} has the unknown content part type {kind!r}; "
                              "a text model takes only 'text' parts", 400, where)
    return "".join(texts)


def text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every content a string (or absent)."""
    out = []
    for i, message in enumerate(messages):
        if isinstance(message.get("content"), list):
            message = {**message, "content": message_text(message["content"], i)}
        out.append(message)
    return out


def _extra_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (kwargs or {}).items() if k not in _RESERVED_TEMPLATE_KWARGS}


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None, kwargs: dict[str, Any] | None,
                chat_template: str | None) -> str:
    """The prompt text from the server's ``chat_template`` (a path or text) or the tokenizer's;
    a template error is a 400 carrying the template's message. Trusted templates only: they
    render in this process."""
    messages = text_messages(messages)
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                             chat_template=chat_template, **_extra_kwargs(kwargs))
    except Exception as exc:  # jinja errors, raise_exception() in the template
        raise OpenAIError(f"The chat template could not render these messages: {type(exc).__name__}: {exc}",
                          400, "messages") from None


async def render_request_chat(renderer: RequestTemplateRenderer, tokenizer: Any, messages: list[dict[str, Any]],
                              add_generation_prompt: bool, tools: list[dict[str, Any]] | None,
                              kwargs: dict[str, Any] | None, request_template: str) -> str:
    """The prompt text from a request's own template, rendered by ``renderer`` off the event loop;
    a template error or a limit reached is a 400 naming ``chat_template``."""
    messages = text_messages(messages)
    try:
        return await renderer.render(request_template, getattr(tokenizer, "special_tokens", None), messages,
                                     add_generation_prompt, tools, _extra_kwargs(kwargs))
    except RenderLimitError as exc:
        raise OpenAIError(str(exc), 400, "chat_template") from None
    except RenderError as exc:  # jinja errors, raise_exception(), sandbox and size refusals
        raise OpenAIError(f"The chat template could not render these messages: {exc}",
                          400, "chat_template") from None
    except RuntimeError as exc:  # the render subprocess could not start
        raise OpenAIError(f"chat_template: {exc}; retry, or leave the field out", 503, "chat_template") from None


def template_kwargs(request: Any) -> dict[str, Any]:
    """chat_template_kwargs with the top-level enable_thinking merged in (they must agree)."""
    kwargs = dict(request.chat_template_kwargs or {})
    if kwargs.get("enable_thinking") is not None and not isinstance(kwargs["enable_thinking"], bool):
        # a string such as "no" would be truthy in the template: thinking on, silently
        raise OpenAIError(f"chat_template_kwargs.enable_thinking must be true or false, got "
                          f"{kwargs['enable_thinking']!r}", 400, "chat_template_kwargs")
    if request.enable_thinking is not None:
        given = kwargs.get("enable_thinking")
        if given is not None and given != request.enable_thinking:
            raise OpenAIError(f"enable_thinking is {request.enable_thinking} but chat_template_kwargs."
                              f"enable_thinking is {given}; give one, or the same value in both",
                              400, "enable_thinking")
        kwargs["enable_thinking"] = request.enable_thinking
    return kwargs


async def chat_prompt_ids(request: Any, tokenizer: Any, server_template: str | None,
                          allow_request_template: bool, renderer: RequestTemplateRenderer | None = None,
                          max_model_len: int = 1 << 30, literal: LiteralSpecialTokens | None = None) -> list[int]:
    """The prompt token ids of a ChatCompletionRequest (ids are not yet checked against the vocabulary).

    ``renderer`` renders a request's own template (default: the process's shared one);
    ``literal`` (``--escape-special-tokens``) keeps special-token strings in user and tool
    content as text.
    """
    if request.chat_template is not None and not allow_request_template:
        raise OpenAIError("chat_template: this server does not take a chat template in the request "
                          "(it runs with --disallow-request-chat-template); leave the field out",
                          400, "chat_template")
    kwargs = template_kwargs(request)
    if request.prompt_token_ids:
        ids = list(request.prompt_token_ids)
    elif not request.messages:
        raise OpenAIError("messages must hold at least one message (or give prompt_token_ids)", 400, "messages")
    elif request.disable_chat_template:
        if len(request.messages) != 1:
            raise OpenAIError(f"disable_chat_template takes exactly one message, whose text is the prompt; "
                              f"got {len(request.messages)}", 400, "disable_chat_template")
        text = message_text(request.messages[0].content, 0) or ""
        plain = literal.encode_content if literal and request.messages[0].role in UNTRUSTED_ROLES else None
        ids = await encode_text(tokenizer, text, max_model_len, "messages", plain)
    else:
        messages, encode = text_messages(request.template_messages()), None
        if literal is not None:
            messages, found, nonce = literal.escape(messages)
            encode = literal.encoder(found, nonce)
        if request.chat_template is not None:
            text = await render_request_chat(renderer or shared_renderer(), tokenizer, messages,
                                             request.add_generation_prompt, request.template_tools(), kwargs,
                                             request.chat_template)
        else:
            text = render_chat(tokenizer, messages, request.add_generation_prompt,
                               request.template_tools(), kwargs, server_template)
        ids = await encode_text(tokenizer, text, max_model_len, "messages", encode)
    return ids + list(request.completion_token_ids or [])
