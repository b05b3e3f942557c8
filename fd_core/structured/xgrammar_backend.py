"""xgrammar (MLC) behind ``GrammarBackend``: optional, with ``--guided-decoding-backend xgrammar``.

Not a dependency of fd-core: xgrammar imports torch (and triton) at import
time, which fd-core needs only for tests. Install it yourself to use it. It
silently ignores some JSON-schema keywords llguidance refuses by name
(``not``, ``if``/``then``/``else``, ``uniqueItems``, ``contains``: measured
in ``benchmarks/structured_engines.py``), so its outputs may not validate
against such schemas. The vocabulary is handed over as raw bytes
(``VocabType.RAW``): ``GrammarVocab`` already decoded byte-fallback pieces
and ``▁``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fd_core.structured.backend import GrammarBackend, GrammarError, GrammarMatcher
from fd_core.structured.vocab import GrammarVocab

__all__ = ["XGrammarBackend"]


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError as e:
        raise GrammarError(f"--guided-decoding-backend xgrammar needs the xgrammar package and torch "
                           f"({e}); pip install xgrammar, or use llguidance (the default)") from None
    return xgrammar


class _Matcher(GrammarMatcher):
    def __init__(self, matcher: Any) -> None:
        self.m = matcher

    def accept_token(self, token_id: int) -> bool:
        return bool(self.m.accept_token(token_id))

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        self.m.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return bool(self.m.is_terminated())

    def rollback(self, num_tokens: int) -> None:
        self.m.rollback(num_tokens)


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, vocab: GrammarVocab, *, any_whitespace: bool = True) -> None:
        super().__init__(vocab, any_whitespace=any_whitespace)
        xgr = _xgr()
        self._xgr = xgr
        info = xgr.TokenizerInfo(list(vocab.tokens), xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                                 stop_token_ids=list(vocab.eos_token_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=2)

    def compile(self, kind: str, text: str, *, any_whitespace: bool | None = None) -> Any:
        ws = self.any_whitespace if any_whitespace is None else any_whitespace
        c = self.compiler
        try:
            if kind == "json":
                return c.compile_json_schema(text, any_whitespace=ws)
            if kind == "regex":
                return c.compile_regex(text)
            if kind == "choice":
                alts = " | ".join(json.dumps(s) for s in json.loads(text))
                return c.compile_grammar(f"root ::= {alts}")
            if kind == "grammar":
                return c.compile_grammar(text)
            if kind == "structural_tag":
                return c.compile_structural_tag(text)
        except Exception as e:  # noqa: BLE001 - xgrammar's errors name the problem
            raise GrammarError(f"the {kind} constraint does not compile (xgrammar): {e}") from None
        raise GrammarError(f"unknown constraint kind {kind!r}")

    def matcher(self, compiled: Any) -> GrammarMatcher:
        return _Matcher(self._xgr.GrammarMatcher(compiled))
