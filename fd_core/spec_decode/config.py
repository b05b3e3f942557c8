"""``--speculative-config``: FastDeploy's keys, parsed into a frozen ``SpeculativeConfig``.

Who calls: the CLI / ``LLM(speculative_config=...)`` boundary, once, through
``parse_speculative_config`` (a JSON string or a dict; None or "" mean off).
The keys and their meanings are FastDeploy's (fastdeploy/config.py
``SpeculativeConfig``), with one alias (``ngram`` for FastDeploy's
``ngram_match``). FastDeploy keys fd-core does not implement are refused by
name, unless they carry FastDeploy's default (a no-op), so a config dumped by
FastDeploy still parses; keys neither knows are refused.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["METHODS", "SpeculativeConfig", "parse_speculative_config"]

logger = logging.getLogger(__name__)

# method -> what proposes the drafts
METHODS = {
    "mtp": "ERNIE's multi-token-prediction block (a model drafter)",
    "ngram": "prompt lookup: the longest n-gram match in the request's own tokens",
    "suffix": "suffix decoding: suffix trees over the request and earlier outputs",
}
_METHOD_ALIASES = {"ngram_match": "ngram"}  # FastDeploy's spelling
_UNSUPPORTED_METHODS = {
    "hybrid_mtp_ngram": "MTP drafts topped up by n-gram matches is not implemented",
    "eagle": "EAGLE draft heads are not implemented",
    "draft_model": "a separate draft model is not implemented (use mtp, ngram or suffix)",
}
MAX_SPECULATIVE_TOKENS = 16  # FastDeploy allows 1..5; longer drafts pay off for suffix decoding

# FastDeploy key -> (its default, which is accepted as a no-op; why anything else is refused)
_UNSUPPORTED_KEYS: dict[str, tuple[Any, str]] = {
    "mtp_strategy": ("default", "the 'with_ngram' strategy (MTP topped up by n-gram) is not implemented"),
    "max_candidate_len": (5, "FastDeploy's windowed top-p verification is not implemented; "
                             "fd-core verifies exactly (greedy prefix / rejection sampling)"),
    "verify_window": (2, "FastDeploy's windowed top-p verification is not implemented; "
                         "fd-core verifies exactly (greedy prefix / rejection sampling)"),
    "num_gpu_block_expand_ratio": (1, "the MTP layer's KV lives in the same block pool as the target's"),
    "model_type": ("main", "an internal FastDeploy field, not a user setting"),
    "sharing_model": (None, "an internal FastDeploy field, not a user setting"),
    "benchmark_mode": (False, "forcing zero accepted drafts for benchmarks is not implemented"),
    "enf_gen_phase_tag": (False, "forcing tokens after the reasoning boundary is not implemented"),
    "enable_draft_logprob": (False, "draft-token logprobs (include_draft_logprobs) are not implemented"),
    "num_extra_cache_layer": (0, "an internal FastDeploy field, derived from the method"),
}
_HINTS = {  # vLLM's names for the same settings
    "prompt_lookup_max": "max_ngram_size",
    "prompt_lookup_min": "min_ngram_size",
}


@dataclass(frozen=True)
class SpeculativeConfig:
    """What drafts tokens and how many. Given to the engine core (scheduler
    token budget, proposer construction) and the runner (MTP only)."""

    method: str  # one of METHODS
    num_speculative_tokens: int = 1  # k: drafts per request per step, 1..MAX_SPECULATIVE_TOKENS
    # mtp: the MTP block's autoregressive steps per engine step (FastDeploy: k >= this)
    num_model_steps: int = 1
    model: str | None = None  # mtp: checkpoint holding the MTP weights (None: the target's own)
    quantization: str | dict[str, Any] | None = None  # mtp: the MTP block's --quantization
    # ngram: n-gram sizes tried, longest first
    max_ngram_size: int = 5
    min_ngram_size: int = 2
    # suffix: tree depth (match + continuation), global cache size (-1: unbounded,
    # 0: no global cache), drafts <= factor * match length, stop below this path probability
    suffix_decoding_max_tree_depth: int = 64
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r}: expected one of {', '.join(METHODS)}")
        _int_in("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        _int_in("num_model_steps", self.num_model_steps, 1, MAX_SPECULATIVE_TOKENS)
        if self.num_model_steps > self.num_speculative_tokens:
            raise ValueError(f"num_model_steps {self.num_model_steps} exceeds num_speculative_tokens "
                             f"{self.num_speculative_tokens}: each MTP step drafts one token")
        if self.num_model_steps not in (1, self.num_speculative_tokens):
            # ERNIE has one MTP layer: its block runs once per draft, k times (FastDeploy sets it to k)
            raise ValueError(f"num_model_steps {self.num_model_steps}: the MTP block runs once per draft, "
                             f"num_speculative_tokens ({self.num_speculative_tokens}) times; give "
                             f"{self.num_speculative_tokens} or leave it out")
        _int_in("min_ngram_size", self.min_ngram_size, 1, 1 << 10)
        _int_in("max_ngram_size", self.max_ngram_size, self.min_ngram_size, 1 << 10,
                "at least min_ngram_size")
        _int_in("suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth,
                self.num_speculative_tokens + 1, 1 << 12, "more than num_speculative_tokens")
        _int_in("suffix_decoding_max_cached_requests", self.suffix_decoding_max_cached_requests, -1, 1 << 40)
        _float_in("suffix_decoding_max_spec_factor", self.suffix_decoding_max_spec_factor, 0.0, float("inf"),
                  "a number > 0", open_low=True)
        _float_in("suffix_decoding_min_token_prob", self.suffix_decoding_min_token_prob, 0.0, 1.0,
                  "a number in [0, 1]")
        if self.model is not None and not (isinstance(self.model, str) and self.model):
            raise ValueError(f"speculative model {self.model!r}: expected a checkpoint path")
        if self.quantization is not None and not isinstance(self.quantization, (str, dict)):
            raise ValueError(f"speculative quantization {self.quantization!r}: expected a name or a dict")
        if self.method != "mtp":
            for key in ("model", "quantization"):
                if getattr(self, key) is not None:
                    raise ValueError(f"speculative {key} is only used by method 'mtp' "
                                     f"(method {self.method!r} has no draft model)")

    @property
    def is_model_drafter(self) -> bool:
        """Whether drafts come from a model forward (with draft probabilities) rather than lookups."""
        return self.method == "mtp"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_speculative_config(value: str | dict[str, Any] | SpeculativeConfig | None) -> SpeculativeConfig | None:
    """``--speculative-config`` (JSON text) or ``LLM(speculative_config=...)`` (a
    dict or a ``SpeculativeConfig``) -> a ``SpeculativeConfig``, or None when off
    (None, "", or a FastDeploy dict whose ``method`` is None)."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config {value!r} is not valid JSON ({exc.msg}); expected an "
                             "object such as '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'") from None
    if not isinstance(value, dict):
        raise ValueError(f"--speculative-config {value!r}: expected a JSON object (a dict)")
    raw = dict(value)
    method = raw.pop("method", None)
    if method is None:
        if raw.get("model") or raw.get("num_speculative_tokens"):
            raise ValueError(f"--speculative-config {value!r} has no 'method': expected one of "
                             f"{', '.join(METHODS)}")
        return None
    if not isinstance(method, str):
        raise ValueError(f"speculative method {method!r}: expected one of {', '.join(METHODS)}")
    method = _METHOD_ALIASES.get(method, method)
    if method in _UNSUPPORTED_METHODS:
        raise ValueError(f"speculative method {method!r} is not supported: {_UNSUPPORTED_METHODS[method]}")
    known = {f.name for f in fields(SpeculativeConfig)}
    for key in list(raw):
        if key in known:
            continue
        if key in _UNSUPPORTED_KEYS:
            default, why = _UNSUPPORTED_KEYS[key]
            if raw[key] != default:
                raise ValueError(f"speculative config key {key!r} = {raw[key]!r} is not supported: {why} "
                                 f"(only FastDeploy's default {default!r} is accepted)")
            del raw[key]
            continue
        hint = _HINTS.get(key)
        more = f" (FastDeploy's name: {hint!r})" if hint else ""
        raise ValueError(f"unknown speculative config key {key!r}{more}; expected one of "
                         f"method, {', '.join(sorted(known - {'method'}))}")
    # FastDeploy raises k to num_model_steps when it is smaller; so do we, and say so
    steps, k = raw.get("num_model_steps", 1), raw.get("num_speculative_tokens", 1)
    if method == "mtp" and _is_int(steps) and _is_int(k) and steps > k:
        logger.warning("speculative num_model_steps %d > num_speculative_tokens %d: using %d draft tokens",
                       steps, k, steps)
        raw["num_speculative_tokens"] = steps
    return SpeculativeConfig(method=method, **raw)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_in(key: str, v: Any, low: int, high: int, what: str = "") -> None:
    if not _is_int(v) or not low <= v <= high:
        bound = f"an integer in [{low}, {high}]" if high < 1 << 10 else f"an integer >= {low}"
        raise ValueError(f"speculative config {key} = {v!r}: expected {bound}" + (f", {what}" if what else ""))


def _float_in(key: str, v: Any, low: float, high: float, what: str, open_low: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high
    if not ok or (open_low and v == low):
        raise ValueError(f"speculative config {key} = {v!r}: expected {what}")
