"""``GuidedDecodingParams``: what a request's output must match (structured output).

Pure Python, validated in ``__post_init__`` like ``SamplingParams`` (which
holds one as ``guided_decoding``): exactly one of ``json``, ``json_object``,
``regex``, ``choice``, ``grammar``, ``structural_tag`` is set, each of the
right type; two at once is a ValueError naming both. Whether the grammar
itself compiles (a bad regex, an unsupported JSON-schema keyword, a grammar
syntax error) is the grammar engine's question (``fd_core.structured``),
asked by the server before the request reaches the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["GUIDED_KINDS", "GuidedDecodingParams"]

# the request kinds, in the order a conflict names them
GUIDED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
BACKENDS = ("auto", "llguidance", "xgrammar")
MAX_SPEC_CHARS = 1 << 20  # a schema / grammar bigger than this is refused before compiling


@dataclass(frozen=True)
class GuidedDecodingParams:
    """One constraint on a request's output (vLLM's ``GuidedDecodingParams``).

    ``json``: a JSON schema (dict, or its JSON text); ``json_object``: any
    JSON object; ``regex``; ``choice``: one of these strings exactly;
    ``grammar``: a Lark grammar or a GBNF (llama.cpp) one; ``structural_tag``:
    the OpenAI/FastDeploy structural-tag object (dict or its JSON text).
    ``backend``: None (the server's ``--guided-decoding-backend``) or one of
    ``BACKENDS``. ``disable_any_whitespace``: JSON without free whitespace.
    ``after_reasoning``: the constraint starts once the reasoning has ended
    (the first ``</think>`` of the output, or a prompt that closed it); the
    server sets it when it runs a reasoning parser.
    """

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None
    backend: str | None = None
    disable_any_whitespace: bool = False
    after_reasoning: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        kinds = [k for k in GUIDED_KINDS if getattr(self, k) not in (None, False)]
        if len(kinds) != 1:
            raise ValueError(
                "guided decoding takes exactly one of json (guided_json / response_format json_schema), "
                "json_object, regex, choice, grammar, structural_tag; "
                + (f"got {' and '.join(kinds)} together" if kinds else "got none")
            )
        for name in ("json", "structural_tag"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = _parse_json(name, value)
            if value is not None and not isinstance(value, (dict, bool)):
                raise ValueError(f"{name} must be a JSON schema object, got {type(value).__name__}: "
                                 f"{_short(value)}")
            if isinstance(value, bool):  # the schemas true / false
                value = {} if value else {"not": {}}
            set_(self, name, value)
        if self.regex is not None and (not isinstance(self.regex, str) or self.regex == ""):
            raise ValueError(f"regex must be a non-empty string, got {_short(self.regex)}")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"grammar must be a non-empty string (Lark or GBNF), got {_short(self.grammar)}")
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice
                    or not all(isinstance(c, str) and c for c in self.choice)):
                raise ValueError(f"choice must be a non-empty list of non-empty strings, got {_short(self.choice)}")
            set_(self, "choice", list(self.choice))
        if not isinstance(self.json_object, bool):
            raise ValueError(f"json_object must be a bool, got {self.json_object!r}")
        for name in ("disable_any_whitespace", "after_reasoning"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"guided decoding backend must be one of {', '.join(BACKENDS)}, "
                             f"got {self.backend!r}")
        size = len(self.spec()[1])
        if size > MAX_SPEC_CHARS:
            raise ValueError(f"the {self.kind} constraint is {size} characters; at most {MAX_SPEC_CHARS} are allowed")

    @property
    def kind(self) -> str:
        """Which of ``GUIDED_KINDS`` is set."""
        return next(k for k in GUIDED_KINDS if getattr(self, k) not in (None, False))

    def spec(self) -> tuple[str, str]:
        """``(kind, text)``: the constraint as the grammar engines take it, and the
        compile cache's key."""
        kind = self.kind
        if kind == "json_object":
            return "json", '{"type": "object"}'
        if kind in ("json", "structural_tag"):
            return kind, json.dumps(getattr(self, kind), ensure_ascii=False)  # key order is output order
        if kind == "choice":
            return kind, json.dumps(self.choice, ensure_ascii=False)
        return kind, str(getattr(self, kind))

    @classmethod
    def from_value(cls, value: Any) -> GuidedDecodingParams | None:
        """None, a ``GuidedDecodingParams`` or a dict of its fields (offline ``LLM``)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(f"guided_decoding has unknown field(s) {', '.join(unknown)}; expected "
                                 f"{', '.join(cls.__dataclass_fields__)}")
            return cls(**value)
        raise ValueError(f"guided_decoding must be a GuidedDecodingParams or a dict, got {type(value).__name__}")


def _parse_json(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not valid JSON: {e}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
