"""Reasoning parsers and tool-call parsers, and their registries.

Owns splitting a model's output text into ``reasoning_content``,
``content`` and tool calls, in one piece or delta by delta, for
``--reasoning-parser`` / ``--tool-call-parser`` (``ernie_x1``,
``ernie-45-vl``, ``qwen3``). Pure Python: the API server process imports it.
May import: fd_core.plugins (for parser plugins). Never paddle or numpy.

Use, per request (parsers keep streaming state, so one instance each)::

    reasoning = ReasoningParserManager.get(name)(tokenizer)
    tools = ToolParserManager.get(name)(tokenizer)
    # complete output
    reasoning_content, content = reasoning.extract_reasoning_content(text, request)
    calls = tools.extract_tool_calls(content or "", request)
    # streaming: the reasoning parser's content deltas are the tool parser's
    # text, so give the tool parser the accumulated content, not the output
    delta = reasoning.extract_reasoning_content_streaming(prev, cur, d, prev_ids, cur_ids, d_ids)
    if delta and delta.content:
        tool_delta = tools.extract_tool_calls_streaming(
            prev_content, prev_content + delta.content, delta.content, [], [], [], request)
    # after the last delta: what each parser held back (the reasoning
    # parser's content tail goes through the tool parser first)
    tail = reasoning.finish_streaming()
    tool_tail = tools.finish_streaming(request)

(``fd_core.entrypoints.openai.chat_parsing.ChoiceParser`` does all this.)
Streamed deltas, joined, equal the one-shot result for any split of the
text, once ``finish_streaming`` was called. Parsers hold back a trailing
piece of text that could still be the start of a tag (and, before a
closing tag, one newline), and a ``<tool_call>`` block until it is known to
be a call or not; at the end of an output what is still held back is
released as text, in both modes (a ``<tool_call>`` that never became a
call stays in the content, tags included).
"""

from fd_core.parsers.base import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCalls,
    FunctionCall,
    ReasoningParser,
    ToolCall,
    ToolParser,
)
from fd_core.parsers.registry import ParserRegistry, ReasoningParserManager, ToolParserManager

__all__ = [
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "ExtractedToolCalls",
    "FunctionCall",
    "ParserRegistry",
    "ReasoningParser",
    "ReasoningParserManager",
    "ToolCall",
    "ToolParser",
    "ToolParserManager",
]
