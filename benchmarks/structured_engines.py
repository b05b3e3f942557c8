"""xgrammar against llguidance, in one run: what chose fd_core's grammar engine.

For each engine installed: the one-off vocabulary set-up, compile time per
JSON schema (cold: caches off or a fresh compiler), the per-token cost of
one matcher (fill its mask row, then accept the token) while walking a valid
instance of each schema, whether ``rollback`` works, and which JSON-schema
keywords compile at all (coverage). Vocabularies: the generated tiny
checkpoint's tokenizer (2,048 tokens) and a 103,424-token one of the ERNIE
4.5 size (the 2,048 trained pieces plus distinct concatenations of two of
them, seeded; real ERNIE weights/tokenizers cannot be downloaded here).
xgrammar needs torch at import (it is only a test dependency of fd-core).

    python benchmarks/structured_engines.py            # both vocabularies
    python benchmarks/structured_engines.py --vocab tiny
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fd_core.structured.vocab import GrammarVocab  # noqa: E402

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
             "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {
            "type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}},
            "required": ["id", "tags"]},
        "ok": {"type": "boolean"}}, "required": ["user", "ok"]},
    "enum_pattern": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["color", "code"]},
    "union_defs": {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                    "required": ["x", "y"]}},
                   "type": "object", "properties": {"shape": {"anyOf": [
                       {"$ref": "#/$defs/pt"}, {"type": "array", "items": {"$ref": "#/$defs/pt"}, "maxItems": 4}]}},
                   "required": ["shape"]},
    "any_json": {"type": "object"},
}
INSTANCES = {
    "flat": {"name": "Ada Lovelace", "age": 36},
    "nested": {"user": {"id": 7, "tags": ["a", "bc"]}, "ok": True},
    "enum_pattern": {"color": "green", "code": "ABC-12"},
    "union_defs": {"shape": [{"x": 1.5, "y": -2}, {"x": 0, "y": 3}]},
    "any_json": {"k": [1, 2, {"z": None}], "s": "text"},
}
# one keyword each: does the engine compile it (vs refuse it)
COVERAGE = {
    "minLength/maxLength": {"type": "string", "minLength": 2, "maxLength": 5},
    "pattern": {"type": "string", "pattern": "^a+b$"},
    "format: date-time": {"type": "string", "format": "date-time"},
    "format: email": {"type": "string", "format": "email"},
    "minimum/maximum": {"type": "integer", "minimum": 3, "maximum": 99},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 0},
    "multipleOf": {"type": "integer", "multipleOf": 5},
    "const": {"const": "x"},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]},
    "$ref recursion": {"$defs": {"n": {"type": "object", "properties": {"c": {"type": "array", "items":
                        {"$ref": "#/$defs/n"}}}}}, "$ref": "#/$defs/n"},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
    "patternProperties": {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}},
    "minProperties": {"type": "object", "minProperties": 1},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "contains": {"type": "array", "contains": {"type": "integer"}},
    "not": {"not": {"type": "string"}},
    "if/then/else": {"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}},
}


def tiny_vocab() -> tuple[GrammarVocab, Any]:
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.tokenizer import Tokenizer
    from fd_core.tokenizer.tokenizer import _read_json

    out = Path(tempfile.mkdtemp(prefix="fd-structured-")) / "tiny"
    generate_checkpoint(out, "tiny-dense")
    tok = Tokenizer.from_pretrained(out)
    eos = _read_json(out / "generation_config.json")["eos_token_id"]
    return GrammarVocab.from_tokenizer(tok, eos), tok


def big_vocab(small: GrammarVocab, size: int = 103424) -> GrammarVocab:
    normal = [t for i, t in enumerate(small.tokens) if i not in small.special_ids and len(t) > 1]
    rng = np.random.default_rng(0)
    seen = set(small.tokens)
    tokens = list(small.tokens)
    while len(tokens) < size:
        a, b = rng.integers(len(normal), size=2)
        t = normal[a] + normal[b]
        if t not in seen:
            seen.add(t)
            tokens.append(t)
    return GrammarVocab.from_token_bytes(tokens, small.eos_token_ids, small.special_ids)


class Xgr:
    name = "xgrammar"

    def __init__(self, vocab: GrammarVocab) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo(list(vocab.tokens), xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                                      stop_token_ids=list(vocab.eos_token_ids))
        self.vocab_size = vocab.vocab_size

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.xgr.GrammarCompiler(self.info, cache_enabled=False).compile_json_schema(json.dumps(schema))

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any, bitmask: np.ndarray) -> None:
        m.fill_next_token_bitmask(bitmask, 0)

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))

    def rollback(self, m: Any, n: int) -> None:
        m.rollback(n)


class Llg:
    """fd-core's own llguidance backend (its vocabulary wrapper, its greedy tokenizer)."""

    name = "llguidance"

    def __init__(self, vocab: GrammarVocab) -> None:
        from fd_core.structured.llguidance_backend import LLGuidanceBackend

        self.b = LLGuidanceBackend(vocab)

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.b.compile("json", json.dumps(schema))

    def matcher(self, compiled: Any) -> Any:
        return self.b.matcher(compiled)

    def fill(self, m: Any, bitmask: np.ndarray) -> None:
        m.fill_bitmask(bitmask, 0)

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))

    def rollback(self, m: Any, n: int) -> None:
        m.rollback(n)


def run_engine(cls: Any, vocab: GrammarVocab, tok: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    engine = cls(vocab)
    setup = time.perf_counter() - t0
    row: dict[str, Any] = {"setup_s": setup, "compile_ms": {}, "mask_us_per_token": {}}
    bitmask = np.zeros((1, (vocab.vocab_size + 31) // 32), np.int32)
    per_token = []
    for name, schema in SCHEMAS.items():
        t0 = time.perf_counter()
        compiled = engine.compile(schema)
        row["compile_ms"][name] = (time.perf_counter() - t0) * 1e3
        ids = tok.encode(json.dumps(INSTANCES[name], separators=(",", ":")))
        m = engine.matcher(compiled)
        t0 = time.perf_counter()
        for t in ids:
            engine.fill(m, bitmask)
            if not engine.accept(m, t):
                raise RuntimeError(f"{engine.name} refused token {t} of a valid {name} instance")
        dt = (time.perf_counter() - t0) / len(ids)
        row["mask_us_per_token"][name] = dt * 1e6
        per_token.append(dt * 1e6)
    m = engine.matcher(engine.compile(SCHEMAS["flat"]))
    ids = tok.encode('{"name":"x","age":1}')
    try:
        for t in ids[:4]:
            engine.accept(m, t)
        engine.rollback(m, 2)
        for t in ids[2:]:
            assert engine.accept(m, t)
        row["rollback"] = "ok"
    except Exception as e:  # noqa: BLE001
        row["rollback"] = f"failed: {e}"
    covered = []
    for name, schema in COVERAGE.items():
        try:
            engine.compile(schema)
            covered.append(name)
        except Exception:  # noqa: BLE001
            pass
    row["coverage"] = f"{len(covered)}/{len(COVERAGE)}"
    row["refused"] = [k for k in COVERAGE if k not in covered]
    row["mask_us_median"] = statistics.median(per_token)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", choices=["tiny", "103k", "both"], default="both")
    args = p.parse_args()
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    print(f"# {cpu or platform.processor()}; python {platform.python_version()}")
    small, tok = tiny_vocab()
    vocabs = {"tiny": small} if args.vocab == "tiny" else {}
    if args.vocab in ("103k", "both"):
        vocabs["103k"] = big_vocab(small)
    if args.vocab == "both":
        vocabs = {"tiny": small, **vocabs}
    for label, vocab in vocabs.items():
        for cls in (Xgr, Llg):
            try:
                row = run_engine(cls, vocab, tok)
            except ImportError as e:
                print(f"{label:5s} {cls.name:10s} not importable: {e}")
                continue
            comp = " ".join(f"{k}={v:.1f}" for k, v in row["compile_ms"].items())
            mask = " ".join(f"{k}={v:.0f}" for k, v in row["mask_us_per_token"].items())
            print(f"{label:5s} {cls.name:10s} vocab {vocab.vocab_size}: setup {row['setup_s']:.2f} s; "
                  f"compile ms {comp}; mask+accept us/token {mask} (median {row['mask_us_median']:.0f}); "
                  f"rollback {row['rollback']}; coverage {row['coverage']} refused {row['refused']}")


if __name__ == "__main__":
    main()
