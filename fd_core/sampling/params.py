"""SamplingParams: what a request asks of the sampler and the stop logic.

Pure Python (no paddle, no numpy): the API server process builds and
validates these. Names and defaults follow vLLM / FastDeploy. Every field is
checked in ``__post_init__``; a bad value raises ValueError naming the field,
the value and what was expected, so the server can answer 400 with it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from fd_core.sampling.guided import GuidedDecodingParams

__all__ = ["SamplingParams", "GREEDY_EPS", "MAX_BAD_WORDS", "MAX_BAD_WORDS_TOKENS", "MAX_STOP", "MAX_LOGPROBS",
           "MAX_LOGIT_BIAS"]

# temperature below this is greedy (vLLM's _SAMPLING_EPS): dividing by it
# would only amplify rounding noise
GREEDY_EPS = 1e-5
MAX_LOGPROBS = 20  # top logprobs per token, as FastDeploy allows
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values
# bad words per request: each is tokenized on the API's event loop and checked at every step
MAX_BAD_WORDS = 1024  # also the bound of bad_words_token_ids and stop_token_ids
# token ids of all bad words of a request together (bad_words_token_ids here; the engine's
# tokenization of bad_words too): the engine compiles them into a matcher once per request,
# O(this) time and memory, after which a step costs the same whatever the words
MAX_BAD_WORDS_TOKENS = 8192
MAX_STOP = 64  # stop strings per request: each is searched for in the text of every step


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(name: str, value: Any, ok: bool, expected: str) -> float:
    """``value`` as a finite float, or ValueError ``<name> must be <expected>``."""
    if not _is_number(value) or not math.isfinite(value) or not ok:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return float(value)


_FLOAT32_MAX = 3.4028234663852886e38
MAX_N = 128  # samples per request; each is a full request in the engine


def _int(name: str, value: Any, minimum: int | None, expected: str) -> int:
    if not _is_int(value) or (minimum is not None and value < minimum):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def _strings(name: str, value: Any) -> list[str]:
    """A str or a list of non-empty str, as a new list."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a string or a list of strings, got {value!r}")
    for item in value:
        if not isinstance(item, str) or item == "":
            raise ValueError(f"{name} must hold non-empty strings, got {item!r} in {value!r}")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{name} must hold valid Unicode, got {item!r} (a lone surrogate)") from None
    return list(value)


def _token_ids(name: str, value: Any) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of token ids, got {value!r}")
    for item in value:
        if not _is_int(item) or item < 0:
            raise ValueError(f"{name} must hold token ids (integers >= 0), got {item!r} in {value!r}")
    return [int(item) for item in value]


def _optional_logprobs(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= MAX_LOGPROBS:
        raise ValueError(f"{name} must be None or an integer in [0, {MAX_LOGPROBS}], got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's tokens and when to stop.

    Frozen: derive a changed copy with ``replace(**changes)`` (validated
    again). ``top_k=-1`` is accepted (vLLM) and stored as 0 (off); ``stop``
    and ``bad_words`` accept a single string; ``logit_bias`` keys may be
    numeric strings (OpenAI JSON) and are stored as ints.
    """

    n: int = 1  # completions to return for the prompt
    temperature: float = 1.0  # 0 (below GREEDY_EPS) = greedy argmax
    top_p: float = 1.0  # in (0, 1]; 1 = off
    top_k: int = 0  # 0 = off (-1 accepted, stored as 0)
    min_p: float = 0.0  # in [0, 1]; drop tokens with p < min_p * max p; 0 = off
    seed: int | None = None  # per-request generator seed; None = fresh OS entropy
    max_tokens: int | None = 16  # None = up to max_model_len
    min_tokens: int = 0  # eos and stop_token_ids are banned until this many outputs
    stop: list[str] = field(default_factory=list)  # stop strings (matched on detokenized text)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False  # keep generating past eos
    bad_words: list[str] = field(default_factory=list)  # tokenized by the engine
    bad_words_token_ids: list[list[int]] | None = None  # pre-tokenized bad words
    logprobs: int | None = None  # top logprobs per output token; 0 = only the sampled one
    prompt_logprobs: int | None = None  # the same for prompt tokens
    repetition_penalty: float = 1.0  # > 0; 1 = off (prompt + output tokens)
    presence_penalty: float = 0.0  # in [-2, 2] (output tokens)
    frequency_penalty: float = 0.0  # in [-2, 2] (output tokens)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    # FastDeploy's extras
    # thinking budget: after this many output tokens still inside the reasoning
    # (no "</think>" yet), the engine emits "</think>" as the next token
    reasoning_max_tokens: int | None = None
    # per-request arguments of the engine's --logits-processors, e.g.
    # {"logit_bias": {"1234": -5.0}} for LogitBiasLogitsProcessor
    logits_processors_args: dict[str, Any] | None = None
    temp_scaled_logprobs: bool = False  # logprobs from logits / temperature
    top_p_normalized_logprobs: bool = False  # logprobs renormalised over the top-p set
    # a chat-template input FastDeploy's scripts pass here: LLM.chat renders the prompt
    # with it (as chat_template_kwargs={"enable_thinking": ...}); None = the template's default
    enable_thinking: bool | None = None
    # structured output: what the output must match (a GuidedDecodingParams, or a dict of
    # its fields, converted); None = unconstrained
    guided_decoding: GuidedDecodingParams | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place once, here
        set_(self, "n", _int("n", self.n, 1, "an integer >= 1"))
        if self.n > MAX_N:
            raise ValueError(f"n must be <= {MAX_N} (samples per request), got {self.n}")
        t = self.temperature
        # the samplers divide float32 logits by it: above float32's largest it would be inf there
        set_(self, "temperature", _number("temperature", t, _is_number(t) and 0 <= t <= _FLOAT32_MAX,
                                          f"a finite number >= 0 and <= {_FLOAT32_MAX:.4g} (float32's largest)"))
        p = self.top_p
        set_(self, "top_p", _number("top_p", p, _is_number(p) and 0 < p <= 1, "in (0, 1]"))
        k = self.top_k
        if not _is_int(k) or k < -1:
            raise ValueError(f"top_k must be -1, 0 or a positive integer, got {k!r}")
        set_(self, "top_k", max(int(k), 0))
        m = self.min_p
        set_(self, "min_p", _number("min_p", m, _is_number(m) and 0 <= m <= 1, "in [0, 1]"))
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be None or an integer, got {self.seed!r}")
        if self.max_tokens is not None:
            _int("max_tokens", self.max_tokens, 1, "None or an integer >= 1")
        _int("min_tokens", self.min_tokens, 0, "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens} "
                f"and max_tokens={self.max_tokens}"
            )
        set_(self, "stop", _strings("stop", self.stop))
        set_(self, "stop_token_ids", _token_ids("stop_token_ids", self.stop_token_ids))
        set_(self, "bad_words", _strings("bad_words", self.bad_words))
        set_(self, "bad_words_token_ids", self._checked_bad_words_token_ids())
        for name, limit in (("bad_words", MAX_BAD_WORDS), ("bad_words_token_ids", MAX_BAD_WORDS),
                            ("stop", MAX_STOP), ("stop_token_ids", MAX_BAD_WORDS)):
            if len(getattr(self, name) or ()) > limit:
                raise ValueError(f"{name} holds {len(getattr(self, name))} entries; at most {limit} are allowed"
                                 + (" (ban single tokens in bulk with logit_bias)" if "bad" in name else ""))
        total = sum(len(word) for word in self.bad_words_token_ids or ())
        if total > MAX_BAD_WORDS_TOKENS:
            raise ValueError(f"bad_words_token_ids hold {total} token ids in all; at most "
                             f"{MAX_BAD_WORDS_TOKENS} are allowed")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                     "temp_scaled_logprobs", "top_p_normalized_logprobs"):
            _flag(name, getattr(self, name))
        if self.enable_thinking is not None:
            _flag("enable_thinking", self.enable_thinking)
        set_(self, "logprobs", _optional_logprobs("logprobs", self.logprobs))
        set_(self, "prompt_logprobs", _optional_logprobs("prompt_logprobs", self.prompt_logprobs))
        r = self.repetition_penalty
        set_(self, "repetition_penalty", _number("repetition_penalty", r, _is_number(r) and r > 0,
                                                 "a finite number > 0"))
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            set_(self, name, _number(name, v, _is_number(v) and -2 <= v <= 2, "in [-2, 2]"))
        set_(self, "logit_bias", self._checked_logit_bias())
        self._check_reasoning_max_tokens()
        set_(self, "logits_processors_args", self._checked_logits_processors_args())
        set_(self, "guided_decoding", GuidedDecodingParams.from_value(self.guided_decoding))

    def _check_reasoning_max_tokens(self) -> None:
        value = self.reasoning_max_tokens
        if value is None:
            return
        _int("reasoning_max_tokens", value, 1, "None or an integer >= 1")
        if self.max_tokens is not None and value > self.max_tokens:
            raise ValueError(  # FastDeploy refuses the same
                f"reasoning_max_tokens must be <= max_tokens, got reasoning_max_tokens={value} "
                f"and max_tokens={self.max_tokens}"
            )

    def _checked_logits_processors_args(self) -> dict[str, Any] | None:
        value = self.logits_processors_args
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(
                f"logits_processors_args must be a dict of argument name -> value, got {value!r}"
            )
        for key in value:
            if not isinstance(key, str) or key == "":
                raise ValueError(
                    f"logits_processors_args keys must be non-empty strings, got {key!r}"
                )
        return dict(value)

    def _checked_bad_words_token_ids(self) -> list[list[int]] | None:
        """A list of token-id lists; FastDeploy's flat list of ids (each a one-token
        word) and a mix of both are accepted and normalised to lists."""
        value = self.bad_words_token_ids
        if value is None:
            return None
        if not isinstance(value, (list, tuple)):
            raise ValueError(
                f"bad_words_token_ids must be a list of token ids or of token-id lists, got {value!r}"
            )
        words: list[Any] = [[item] if _is_int(item) else item for item in value]
        for item, word in zip(value, words):
            if (not isinstance(word, (list, tuple)) or len(word) == 0
                    or not all(_is_int(t) and t >= 0 for t in word)):
                raise ValueError(
                    "bad_words_token_ids must hold token ids (integers >= 0) or non-empty lists "
                    f"of them, got {item!r} in {value!r}"
                )
        return [[int(t) for t in word] for word in words]

    def _checked_logit_bias(self) -> dict[int, float] | None:
        value = self.logit_bias
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {value!r}")
        bias = {}
        for key, v in value.items():
            try:
                token = int(key) if isinstance(key, str) else key
            except ValueError:
                token = key
            if not _is_int(token) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {key!r}")
            if not _is_number(v) or not math.isfinite(v) or abs(v) > MAX_LOGIT_BIAS:
                raise ValueError(
                    f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
                    f"got {v!r} for token {key!r}"
                )
            bias[int(token)] = float(v)
        return bias

    @property
    def greedy(self) -> bool:
        """True when the request takes the argmax (temperature below GREEDY_EPS)."""
        return self.temperature < GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        """True when any of repetition, presence or frequency penalty is on."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def replace(self, **changes: Any) -> SamplingParams:
        """A validated copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def clone(self) -> SamplingParams:
        """A deep copy: its lists and dicts are not shared with this one."""
        return copy.deepcopy(self)
