"""A request's structured-output fields as one ``GuidedDecodingParams`` (or None).

Called by the chat and completion serving modules while building a
request's SamplingParams. Takes OpenAI's ``response_format`` (``json_object``,
``json_schema`` with ``strict``, FastDeploy's ``structural_tag``), vLLM's
and FastDeploy's ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
``guided_grammar`` / ``guided_json_object`` / ``structural_tag`` /
``guided_decoding_backend`` / ``guided_whitespace_pattern`` (only the
no-whitespace pattern ``""`` is served), and for chat ``tool_choice``
``"required"`` or a named function (the output is then the JSON of the
calls, turned into ``tool_calls`` by ``forced_tool_calls``, or streamed
piece by piece by ``ForcedToolStream``; ``parallel_tool_calls: false``
makes "required" exactly one call). Two
constraints at once are a 400 naming both fields; whether the constraint
compiles is the engine's check (a 400 naming the problem as well).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fd_core.entrypoints.openai.errors import OpenAIError
from fd_core.sampling.guided import GuidedDecodingParams

__all__ = ["ForcedToolStream", "forced_tool_calls", "forces_tools", "guided_params", "tool_choice_schema"]


def tool_choice_schema(request: Any) -> dict[str, Any] | None:
    """The JSON schema ``tool_choice`` forces: a named function's arguments object,
    or for ``"required"`` a non-empty array of ``{"name", "parameters"}`` calls."""
    choice = getattr(request, "tool_choice", None)
    if choice is None or choice in ("none", "auto"):
        return None
    tools = getattr(request, "tools", None) or []
    if not tools:
        raise OpenAIError("tool_choice 'required' or a named function needs tools", 400, "tool_choice")
    params = {t.function.name: t.function.parameters or {"type": "object"} for t in tools}
    if choice == "required":  # parallel_tool_calls false: exactly one call
        return {"type": "array", "minItems": 1, **({"maxItems": 1} if _single_call(request) else {}),
                "items": {"anyOf": [
                    {"type": "object", "properties": {"name": {"const": name}, "parameters": schema},
                     "required": ["name", "parameters"], "additionalProperties": False}
                    for name, schema in params.items()]}}
    name = choice.function.name
    if name not in params:
        raise OpenAIError(f"tool_choice names function {name!r}, which is not among the tools "
                          f"({', '.join(params)})", 400, "tool_choice")
    return params[name]


def _single_call(request: Any) -> bool:
    """``parallel_tool_calls: false``: at most one tool call."""
    return getattr(request, "parallel_tool_calls", None) is False


def forces_tools(request: Any) -> bool:
    """True when ``tool_choice`` ("required" or a named function) constrains the output."""
    choice = getattr(request, "tool_choice", None)
    return choice is not None and choice not in ("none", "auto")


def guided_params(request: Any, reasoning: bool) -> GuidedDecodingParams | None:
    """The request's constraint; ``reasoning``: the server runs a reasoning parser
    (the constraint then starts after the reasoning)."""
    found: dict[str, dict[str, Any]] = {}  # field -> GuidedDecodingParams kwargs
    fmt = getattr(request, "response_format", None)
    if fmt is not None and fmt.type != "text":
        found["response_format"] = _response_format(fmt)
    for field, kind in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                        ("guided_grammar", "grammar"), ("structural_tag", "structural_tag")):
        value = getattr(request, field, None)
        if value is not None:
            found[field] = {kind: value}
    if getattr(request, "guided_json_object", None):
        found["guided_json_object"] = {"json_object": True}
    schema = tool_choice_schema(request)
    if schema is not None:
        found["tool_choice"] = {"json": schema}
    if len(found) > 1:
        names = sorted(found)
        raise OpenAIError(f"{' and '.join(names)} each constrain the output; send only one of them", 400, names[1])
    backend = getattr(request, "guided_decoding_backend", None)
    pattern = getattr(request, "guided_whitespace_pattern", None)
    if pattern not in (None, ""):
        raise OpenAIError("guided_whitespace_pattern is served only as \"\" (no whitespace); got "
                          f"{pattern!r}", 400, "guided_whitespace_pattern")
    if not found:
        if backend is not None or pattern is not None:
            field = "guided_decoding_backend" if backend is not None else "guided_whitespace_pattern"
            raise OpenAIError(f"{field} needs a constraint (response_format, guided_json, ...)", 400, field)
        return None
    (field, kwargs), = found.items()
    try:
        return GuidedDecodingParams(**kwargs, backend=backend, disable_any_whitespace=pattern == "",
                                    after_reasoning=reasoning)
    except (ValueError, TypeError) as e:
        raise OpenAIError(f"{field}: {e}", 400, field) from None


def _response_format(fmt: Any) -> dict[str, Any]:
    extra = fmt.model_extra or {}
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if not isinstance(spec, dict):
            raise OpenAIError("response_format json_schema needs a json_schema object {\"name\", \"schema\", "
                              "\"strict\"}", 400, "response_format")
        schema = spec.get("schema", spec.get("json_schema"))
        if schema is None:
            raise OpenAIError("response_format.json_schema has no 'schema'", 400, "response_format")
        return {"json": schema}
    if fmt.type == "structural_tag":
        return {"structural_tag": {k: extra.get(k) for k in ("structures", "triggers")}}
    raise OpenAIError(f"response_format type must be one of text, json_object, json_schema, structural_tag; "
                      f"got {fmt.type!r}", 400, "response_format")


def forced_tool_calls(request: Any, content: str | None) -> list[dict[str, Any]] | None:
    """The ``tool_calls`` of an output constrained by ``tool_choice`` (None when it is
    not, or the output is not complete JSON: cut off by max_tokens)."""
    choice = getattr(request, "tool_choice", None)
    if choice is None or choice in ("none", "auto") or content is None:
        return None
    try:
        value = json.loads(content)
    except json.JSONDecodeError:
        return None
    calls = value if choice == "required" else [{"name": choice.function.name, "parameters": value}]
    if not isinstance(calls, list):
        return None
    return [{"id": _call_id(), "type": "function",
             "function": {"name": c.get("name"), "arguments": json.dumps(c.get("parameters"), ensure_ascii=False)}}
            for c in calls if isinstance(c, dict)]


class ForcedToolStream:
    """Streams the calls of an output ``tool_choice`` constrains, as OpenAI's
    ``tool_calls`` deltas: a call's ``id``, ``type`` and ``name`` once its name is
    known, then its ``arguments`` in pieces as the JSON grows (vLLM's form).

    ``ChoiceParser.delta`` feeds it the content text (after any reasoning);
    ``feed`` returns the new deltas. A named function's output *is* the
    arguments object; "required"'s is ``[{"name": ..., "parameters": {...}}, ...]``
    (keys in that order: the schema's), scanned one character at a time
    (strings and nesting tracked, so braces inside strings do not count).
    Joined, a call's pieces are the raw JSON text of its arguments (the
    whole-output path re-serializes them: same value, maybe other spacing);
    whitespace at the end of what has arrived is held back until more comes.
    """

    def __init__(self, request: Any) -> None:
        choice = request.tool_choice
        self.named: str | None = None if choice == "required" else choice.function.name
        self.text = ""
        self._pos = 0  # characters scanned
        self._depth = 0
        self._in_string = self._escape = False
        self._string_start = 0
        self._key: str | None = None  # the element's key whose value is being read
        self._expect_key = False
        # per call: [id, name or None, arguments start, arguments end or None, name sent, arguments sent]
        self.calls: list[list[Any]] = []
        if self.named is not None:
            self.calls.append([_call_id(), self.named, 0, None, False, 0])

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The ``tool_calls`` deltas ``text`` (the next piece of content) completes."""
        self.text += text
        if self.named is None:
            self._scan()
        out = []
        for index, call in enumerate(self.calls):
            call_id, name, start, end, sent, args_sent = call
            if name is None or not self.text.strip():  # nothing yet (e.g. still reasoning)
                continue
            piece: dict[str, Any] = {"index": index}
            if not sent:
                piece.update(id=call_id, type="function", function={"name": name, "arguments": ""})
                call[4] = True
            if start is not None:
                args = self.text[start:end].strip()  # end None: all so far, trailing blanks held back
                if len(args) > args_sent:
                    piece.setdefault("function", {})["arguments"] = args[args_sent:]
                    call[5] = len(args)
            if len(piece) > 1:
                out.append(piece)
        return out

    def calls_sent(self) -> bool:
        """True once a call's header went out."""
        return any(call[4] for call in self.calls)

    def _scan(self) -> None:
        """Advance the "required" scanner over the new text: finds each call's name
        and where its parameters start and end."""
        text = self.text
        for i in range(self._pos, len(text)):
            ch = text[i]
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
                    self._string_end(text[self._string_start:i + 1])
                continue
            if ch == '"':
                self._in_string, self._string_start = True, i
                continue
            if ch in "[{":
                self._depth += 1
                if self._depth == 2 and ch == "{":  # a call object
                    self.calls.append([_call_id(), None, None, None, False, 0])
                    self._expect_key = True
            elif ch in "]}":
                if self._depth == 2:
                    self._end_value(i)
                self._depth -= 1
            elif self._depth == 2 and ch == ",":
                self._end_value(i)
                self._expect_key = True
            elif self._depth == 2 and ch == ":" and self._key == "parameters" and self.calls:
                self.calls[-1][2] = i + 1
        self._pos = len(text)

    def _string_end(self, raw: str) -> None:
        if self._depth != 2 or not self.calls:
            return
        value = json.loads(raw)
        if self._expect_key:
            self._key, self._expect_key = value, False
        elif self._key == "name" and isinstance(value, str):
            self.calls[-1][1] = value

    def _end_value(self, i: int) -> None:
        if self._key == "parameters" and self.calls and self.calls[-1][3] is None and self.calls[-1][2] is not None:
            self.calls[-1][3] = i
        self._key = None


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
