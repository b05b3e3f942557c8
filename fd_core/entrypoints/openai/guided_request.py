"""A request's structured-output fields as one ``GuidedDecodingParams`` (or None).

Called by the chat and completion serving modules while building a
request's SamplingParams. Takes OpenAI's ``response_format`` (``json_object``,
``json_schema`` with ``strict``, FastDeploy's ``structural_tag``), vLLM's
and FastDeploy's ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
``guided_grammar`` / ``guided_json_object`` / ``structural_tag`` /
``guided_decoding_backend`` / ``guided_whitespace_pattern`` (only the
no-whitespace pattern ``""`` is served), and for chat ``tool_choice``
``"required"`` or a named function (the output is then the JSON of the
calls, turned into ``tool_calls`` by ``forced_tool_calls``). Two
constraints at once are a 400 naming both fields; whether the constraint
compiles is the engine's check (a 400 naming the problem as well).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fd_core.entrypoints.openai.errors import OpenAIError
from fd_core.sampling.guided import GuidedDecodingParams

__all__ = ["forced_tool_calls", "guided_params", "tool_choice_schema"]


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
    if choice == "required":
        return {"type": "array", "minItems": 1, "items": {"anyOf": [
            {"type": "object", "properties": {"name": {"const": name}, "parameters": schema},
             "required": ["name", "parameters"], "additionalProperties": False}
            for name, schema in params.items()]}}
    name = choice.function.name
    if name not in params:
        raise OpenAIError(f"tool_choice names function {name!r}, which is not among the tools "
                          f"({', '.join(params)})", 400, "tool_choice")
    return params[name]


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
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.get("name"), "arguments": json.dumps(c.get("parameters"), ensure_ascii=False)}}
            for c in calls if isinstance(c, dict)]
