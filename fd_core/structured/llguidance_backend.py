"""llguidance (guidance-ai, Rust, no torch) behind ``GrammarBackend``: the default.

Chosen on measurements (``benchmarks/structured_engines.py``, README
"Structured output"): compiling a schema takes well under a millisecond
where xgrammar takes 1-75 ms on a 103k vocabulary, a step's mask costs the
same or less, unsupported JSON-schema keywords are refused by name (xgrammar
ignores several silently), ``rollback`` works, and it imports without torch.

The grammar a request gets is llguidance's own (``grammar_from_*``):
JSON schemas through its JSON compiler (``whitespace_flexible`` off with
``--guided-decoding-disable-any-whitespace``), regexes, choices as a Lark
alternation of literals, Lark or GBNF grammars (``any_to_lark``) and
structural tags (``StructTag``). ``validate`` checks a constraint without
the vocabulary (fast: the engine calls it when a request arrives);
``compile`` builds the grammar against the vocabulary (the slow part, on
the manager's thread pool: llguidance drops the GIL while it works).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from fd_core.structured.backend import GrammarBackend, GrammarError, GrammarMatcher
from fd_core.structured.vocab import GrammarVocab

__all__ = ["LLGuidanceBackend", "grammar_text"]


def _llg() -> Any:
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - it is a dependency of fd-core
        raise GrammarError(f"structured output needs the llguidance package ({e}); pip install llguidance") from None
    return llguidance


def grammar_text(kind: str, text: str, any_whitespace: bool = True) -> str:
    """llguidance's grammar for ``(kind, text)``; GrammarError naming the problem."""
    llg = _llg()
    matcher = llg.LLMatcher
    try:
        if kind == "json":
            grammar = matcher.grammar_from_json_schema(
                text, overrides={"whitespace_flexible": any_whitespace})
        elif kind == "regex":
            grammar = matcher.grammar_from_regex(text)
        elif kind == "choice":
            grammar = matcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(text)))
        elif kind == "grammar":
            from llguidance.gbnf_to_lark import any_to_lark

            grammar = matcher.grammar_from_lark(any_to_lark(text))
        elif kind == "structural_tag":
            grammar = matcher.grammar_from_lark(_structural_tag_lark(json.loads(text)))
        else:
            raise GrammarError(f"unknown constraint kind {kind!r}")
    except GrammarError:
        raise
    except Exception as e:  # noqa: BLE001 - the library's conversion errors name the problem
        raise GrammarError(f"the {_what(kind)} does not compile: {e}") from None
    return str(grammar)


def _what(kind: str) -> str:
    return {"json": "JSON schema", "regex": "regex", "choice": "choice list", "grammar": "grammar",
            "structural_tag": "structural_tag"}.get(kind, kind)


def _structural_tag_lark(tag: dict[str, Any]) -> str:
    """OpenAI/vLLM's ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``
    as llguidance's Lark (free text, each structure where its trigger appears)."""
    from llguidance import StructTag

    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not structures or not isinstance(triggers, list) or not triggers:
        raise GrammarError("structural_tag needs non-empty 'structures' (each {begin, schema, end}) and "
                           f"'triggers' lists; got keys {sorted(tag)}")
    tags = []
    for s in structures:
        if not isinstance(s, dict) or not isinstance(s.get("begin"), str) or not isinstance(s.get("end"), str):
            raise GrammarError(f"each structural_tag structure needs string 'begin' and 'end', got {s!r}")
        trigger = next((t for t in triggers if isinstance(t, str) and t and s["begin"].startswith(t)), None)
        if trigger is None:
            raise GrammarError(f"structural_tag structure begin {s['begin']!r} starts with none of the "
                               f"triggers {triggers!r}")
        schema = s.get("schema") or s.get("parameters") or {}
        tags.append(StructTag(trigger=trigger, begin=s["begin"], grammar=schema, end=s["end"]))
    return str(StructTag.to_grammar(tags, assume_special=False))


class _Vocab:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer. llguidance
    tokenizes the bytes a grammar forces (to mask what follows them right);
    ``greedy`` is its own greedy tokenizer over the same vocabulary (any
    tokenization of the bytes works; sentencepiece's would add its dummy
    prefix)."""

    def __init__(self, vocab: GrammarVocab, greedy: Any = None) -> None:
        self.eos_token_id = vocab.eos_token_ids[0]
        self.bos_token_id = None
        self.tokens = list(vocab.tokens)
        self.special_token_ids = sorted(vocab.special_ids)
        self.greedy = greedy

    def __call__(self, text: Any) -> list[int]:
        if self.greedy is None:
            return []
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self.greedy.greedy_tokenize(text))


class _Matcher(GrammarMatcher):
    def __init__(self, matcher: Any) -> None:
        self.m = matcher

    def accept_token(self, token_id: int) -> bool:
        return bool(self.m.consume_token(token_id))

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        v = bitmask[row]
        self.m.unsafe_compute_mask_ptr(v.ctypes.data, v.nbytes)

    def is_terminated(self) -> bool:
        return bool(self.m.is_stopped())

    def rollback(self, num_tokens: int) -> None:
        if not self.m.rollback(num_tokens):
            raise GrammarError(f"cannot roll back {num_tokens} tokens: {self.m.get_error()}")

    def error(self) -> str | None:
        return str(self.m.get_error()) if self.m.is_error() else None


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"

    def __init__(self, vocab: GrammarVocab, *, any_whitespace: bool = True) -> None:
        super().__init__(vocab, any_whitespace=any_whitespace)
        llg = _llg()
        self._llg = llg
        eos = list(vocab.eos_token_ids)
        greedy = llg.LLTokenizer(llg.TokenizerWrapper(_Vocab(vocab)), n_vocab=vocab.vocab_size, eos_token=eos)
        self.tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(_Vocab(vocab, greedy)), n_vocab=vocab.vocab_size,
                                         eos_token=eos)
        self._executor = llg.LLExecutor()

    @staticmethod
    def validate(kind: str, text: str, any_whitespace: bool = True) -> str:
        """The grammar for ``(kind, text)``, checked without a vocabulary; GrammarError."""
        grammar = grammar_text(kind, text, any_whitespace)
        is_error, messages = _llg().LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise GrammarError(f"the {_what(kind)} does not compile: {messages[0].strip()}")
        return grammar

    def compile(self, kind: str, text: str, *, any_whitespace: bool | None = None) -> Any:
        ws = self.any_whitespace if any_whitespace is None else any_whitespace
        grammar = grammar_text(kind, text, ws)
        # building a matcher compiles the grammar against the vocabulary (and checks it)
        probe = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if probe.is_error():
            raise GrammarError(f"the {_what(kind)} does not compile: {probe.get_error()}")
        return probe  # a pristine matcher at the start: each request gets a copy

    def matcher(self, compiled: Any) -> GrammarMatcher:
        return _Matcher(compiled.deep_copy())

    def fill_bitmasks(self, matchers: Sequence[tuple[GrammarMatcher, int]], bitmask: np.ndarray) -> None:
        if len(matchers) < 4:  # the thread pool's hand-off costs more than a few rows
            super().fill_bitmasks(matchers, bitmask)
            return
        rows = [(m.m, row) for m, row in matchers if isinstance(m, _Matcher)]
        self._executor.unsafe_compute_mask_ptr(rows, bitmask.ctypes.data, bitmask.shape[1] * 4, bitmask.shape[0])
