"""Chat templates: ERNIE 4.5's default, loading an override, and rendering.

Rendering mirrors HF transformers' `apply_chat_template(..., tokenize=False)`
byte for byte: a sandboxed jinja2 environment with trim_blocks/lstrip_blocks,
the same helpers (`raise_exception`, `tojson`, `strftime_now`, `dict`,
`namespace`, loop controls, the `{% generation %}` tag), None-valued message
keys dropped, reasoning fields aliased, and the tokenizer's named special
tokens (`bos_token`, `cls_token`, ...) visible to the template.

`ChatTemplate(..., restricted=True)` is for templates from requests (untrusted):
`*` and `**` refuse results that would be huge, `range` is capped lower, and the
rendered text is bounded. Time and memory are bounded by the caller, which
renders restricted templates in a subprocess
(fd_core/entrypoints/openai/template_sandbox.py).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ERNIE_CHAT_TEMPLATE", "ChatTemplate", "TemplateLimitError", "load_chat_template"]

# Limits of a restricted (request) template. Real chat templates loop over the
# messages and tools and repeat short strings; none comes near these.
RESTRICTED_MAX_RANGE = 10_000  # items of one range(); jinja's own sandbox allows 100_000
RESTRICTED_MAX_ITEMS = 1_000_000  # chars / items of one `*` result (str, list, tuple)
RESTRICTED_MAX_INT_BITS = 100_000  # bits of an int made by `*` or `**`
RESTRICTED_MAX_OUTPUT_CHARS = 8 * 1024 * 1024  # chars of the rendered prompt

# ERNIE 4.5's format: <|begin_of_sentence|>, system text + "\n", "User: ...\n",
# "Assistant: ...<|end_of_sentence|>", and the prompt "Assistant: ". Tools,
# tool calls, tool outputs and thinking follow ERNIE-4.5-*-Thinking's markers
# (<tool_call>, <tool_output>, <think>); enable_thinking=false pre-fills an
# empty think block so the model answers directly.
ERNIE_CHAT_TEMPLATE = """\
{%- if not add_generation_prompt is defined -%}{%- set add_generation_prompt = false -%}{%- endif -%}
{%- if not cls_token is defined -%}{%- set cls_token = "<|begin_of_sentence|>" -%}{%- endif -%}
{%- if not sep_token is defined -%}{%- set sep_token = "<|end_of_sentence|>" -%}{%- endif -%}
{%- macro render_content(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content is iterable -%}
{%- for part in content -%}
{%- if part is string -%}{{- part -}}
{%- elif part["type"] == "text" -%}{{- part["text"] -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{{- cls_token -}}
{%- set ns = namespace(start=0) -%}
{%- if messages and messages[0]["role"] == "system" -%}
{{- render_content(messages[0]["content"]) + "\\n" -}}
{%- set ns.start = 1 -%}
{%- endif -%}
{%- if tools -%}
{{- "You can call the following tools. Tool list:\\n<tool_list>" + (tools | tojson) + "</tool_list>\\n" -}}
{{- "To call a tool, reply with <tool_call>\\n{\\"name\\": <tool name>, \\"arguments\\": <JSON object>}\\n</tool_call>\\n" -}}
{%- endif -%}
{%- for message in messages[ns.start:] -%}
{%- if message["role"] == "system" -%}
{{- render_content(message["content"]) + "\\n" -}}
{%- elif message["role"] == "user" -%}
{{- "User: " + render_content(message["content"]) + "\\n" -}}
{%- elif message["role"] == "assistant" -%}
{{- "Assistant: " -}}
{%- if message["reasoning_content"] is defined and message["reasoning_content"] -%}
{{- "<think>\\n" + message["reasoning_content"] + "\\n</think>\\n\\n" -}}
{%- endif -%}
{%- if message["content"] is defined -%}{{- render_content(message["content"]) -}}{%- endif -%}
{%- if message["tool_calls"] is defined -%}
{%- for call in message["tool_calls"] -%}
{%- set fn = call["function"] if call["function"] is defined else call -%}
{%- set args = fn["arguments"] if fn["arguments"] is string else (fn["arguments"] | tojson) -%}
{{- "<tool_call>\\n{\\"name\\": " + (fn["name"] | tojson) + ", \\"arguments\\": " + args + "}\\n</tool_call>\\n" -}}
{%- endfor -%}
{%- endif -%}
{{- sep_token -}}
{%- elif message["role"] == "tool" -%}
{{- "<tool_output>\\n" + render_content(message["content"]) + "\\n</tool_output>\\n" -}}
{%- else -%}
{{- raise_exception("Unknown message role: " + message["role"]) -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- "Assistant: " -}}
{%- if enable_thinking is defined and not enable_thinking -%}{{- "<think>\\n\\n</think>\\n\\n" -}}{%- endif -%}
{%- endif -%}
"""

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def load_chat_template(template: str | os.PathLike[str]) -> str:
    """Resolve a `--chat-template` value: a path to a jinja file, or the template itself."""
    text = os.fspath(template)
    if "{" not in text and "\n" not in text:
        path = Path(text)
        if not path.is_file():
            raise ValueError(
                f"chat template {text!r} is neither a readable file nor a jinja template; "
                "pass a path to a .jinja file or the template text"
            )
        return path.read_text(encoding="utf-8")
    return text


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace, refusing underscore attributes (as HF does) to keep the sandbox shut."""

    def __setitem__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set {name!r} on a namespace"
            )
        super().__setitem__(name, value)


class TemplateLimitError(jinja2.exceptions.SecurityError):
    """A restricted template went past one of its size limits."""


def _restricted_range(*args: int) -> range:
    rng = range(*args)
    if len(rng) > RESTRICTED_MAX_RANGE:
        raise TemplateLimitError(
            f"range({', '.join(map(str, args))}) has {len(rng)} items; a request's chat template may make ranges "
            f"of at most {RESTRICTED_MAX_RANGE}"
        )
    return rng


def _check_size(operator: str, left: Any, right: Any) -> None:
    """Refuse `left <operator> right` before computing it when the result would be huge."""
    if operator == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                size = len(seq) * count
                if size > RESTRICTED_MAX_ITEMS:
                    raise TemplateLimitError(
                        f"'*' would make a {type(seq).__name__} of {size} items; a request's chat "
                        f"template may make at most {RESTRICTED_MAX_ITEMS}"
                    )
                return
        if isinstance(left, int) and isinstance(right, int):
            bits = abs(left).bit_length() + abs(right).bit_length()
            if bits > RESTRICTED_MAX_INT_BITS:
                raise TemplateLimitError(
                    f"'*' would make an int of about {bits} bits; a request's chat template may "
                    f"make at most {RESTRICTED_MAX_INT_BITS}"
                )
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        bits = max(abs(left).bit_length() - 1, 0) * right  # ~ log2(|left| ** right)
        if abs(left) > 1 and (right > RESTRICTED_MAX_INT_BITS or bits > RESTRICTED_MAX_INT_BITS):
            raise TemplateLimitError(
                f"'**' with exponent {right} would make an int of more than "
                f"{RESTRICTED_MAX_INT_BITS} bits, the limit for a request's chat template"
            )


class _RestrictedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox for request templates: size checks on `*` and `**`
    (intercepting them also stops jinja folding `'a' * 10**10` at compile time)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_size(operator, left, right)
        return super().call_binop(context, operator, left, right)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=16)
def _compile(source: str, restricted: bool = False) -> jinja2.Template:
    env_class = _RestrictedSandbox if restricted else ImmutableSandboxedEnvironment
    env = env_class(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    if restricted:
        env.globals["range"] = _restricted_range
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = dict
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def _prepare_message(message: Mapping[str, Any]) -> dict[str, Any]:
    msg = {k: v for k, v in message.items() if v is not None}
    reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
    if reasoning is not None:
        msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
    return msg


class ChatTemplate:
    """A compiled chat template; `render` turns OpenAI-style messages into the prompt text."""

    def __init__(
        self,
        source: str,
        special_tokens: Mapping[str, str] | None = None,
        restricted: bool = False,
    ) -> None:
        """`restricted=True` for untrusted (request) templates: see the module docstring."""
        self.source = source
        self.special_tokens = dict(
            special_tokens or {}
        )  # e.g. {"bos_token": "<s>", "cls_token": ...}
        self.restricted = restricted
        self._template = _compile(source, restricted)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **chat_template_kwargs: Any,
    ) -> str:
        """Render `messages` (dicts with role/content/...) the way HF's apply_chat_template does.

        `chat_template_kwargs` (e.g. `enable_thinking=False`) become template
        variables and override the special-token names.
        """
        if not messages:
            raise ValueError(
                "cannot apply a chat template to an empty conversation; pass at least one message"
            )
        for message in messages:
            if not isinstance(message, Mapping):
                raise TypeError(
                    f"chat messages must be dicts with 'role' and 'content', got {message!r}"
                )
        variables = {**self.special_tokens, **chat_template_kwargs}
        context = dict(
            messages=[_prepare_message(m) for m in messages],
            tools=list(tools) if tools is not None else None,
            documents=list(documents) if documents is not None else None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        if not self.restricted:
            return self._template.render(**context)
        # the same text as render() (which joins these pieces), stopped once too long
        pieces, size = [], 0
        for piece in self._template.generate(**context):
            size += len(piece)
            if size > RESTRICTED_MAX_OUTPUT_CHARS:
                raise TemplateLimitError(
                    f"the rendered prompt is longer than {RESTRICTED_MAX_OUTPUT_CHARS} characters, "
                    "the limit for a request's chat template"
                )
            pieces.append(piece)
        return "".join(pieces)
