"""The tokenizer side of a request: prompt encoding, bad words, n > 1 fan-out.

Shared by the in-process ``LLMEngine`` and the server's engine client, so
both turn a user request into the same ``EngineCoreRequest``s.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from fd_core.engine.output_processor import OutputProcessor
from fd_core.engine.request import EngineCoreRequest
from fd_core.sampling.params import MAX_BAD_WORDS_TOKENS, SamplingParams

__all__ = ["PREFILL_ADDR", "Frontend", "encode_prompt", "tokenize_bad_words"]

# --splitwise-role decode: the prefill instance the router chose for the request being served
# (the HTTP header x-fd-prefill-addr, set per request by the API server); prepare() copies it
# into each EngineCoreRequest.prefill_addr
PREFILL_ADDR: ContextVar[str | None] = ContextVar("fd_prefill_addr", default=None)


def encode_prompt(tokenizer: Any, prompt: str | list[int] | dict[str, Any]) -> tuple[str | None, list[int]]:
    """Text, token ids, or ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}``."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if "prompt" not in prompt:
            raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")
        prompt = prompt["prompt"]
    if isinstance(prompt, str):
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None, list(prompt)
    raise TypeError(f"a prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}")


def tokenize_bad_words(tokenizer: Any, words: list[str]) -> list[list[int]]:
    """Token sequences to ban for each bad word, with and without a leading space.
    ValueError for words too long to come to at most ``MAX_BAD_WORDS_TOKENS`` tokens,
    told by their length before any is tokenized."""
    per_token = getattr(tokenizer, "max_token_bytes", None) or 64
    chars = sum(map(len, words))
    if chars > MAX_BAD_WORDS_TOKENS * per_token:
        raise ValueError(f"bad_words hold {chars} characters, more than {MAX_BAD_WORDS_TOKENS} tokens "
                         "(the most bad words may come to) can hold")
    out: dict[tuple[int, ...], None] = {}  # ordered and deduplicated in linear time
    for word in words:
        for variant in (word, " " + word.lstrip()):
            ids = tuple(tokenizer.encode(variant))
            if ids:
                out[ids] = None
    return [list(ids) for ids in out]


class Frontend:
    """Prepares requests for the engine core and turns its outputs into text."""

    def __init__(self, tokenizer: Any, eos_token_ids: list[int], vocab_size: int, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.processor = OutputProcessor(tokenizer)

    def prepare(
        self, request_id: str, prompt: str | list[int] | dict[str, Any], params: SamplingParams | None,
        arrival_time: float,
    ) -> list[EngineCoreRequest]:
        """Validate and track a request; returns one core request per sample.
        Raises ValueError/TypeError naming the problem (nothing is tracked then)."""
        params = params or SamplingParams()
        text, token_ids = encode_prompt(self.tokenizer, prompt)
        if not token_ids:
            raise ValueError("the prompt is empty; send at least one token")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, but --max-model-len is {self.max_model_len}: "
                "it must be shorter, to leave room for at least one generated token"
            )
        bad_words = tokenize_bad_words(self.tokenizer, list(params.bad_words or []))
        total = sum(map(len, bad_words)) + sum(map(len, params.bad_words_token_ids or []))
        if total > MAX_BAD_WORDS_TOKENS:  # the sampler compiles them once per request: bounded work
            raise ValueError(f"bad_words and bad_words_token_ids come to {total} tokens; at most "
                             f"{MAX_BAD_WORDS_TOKENS} are allowed")
        child_ids = self.processor.add_request(request_id, text, token_ids, params, arrival_time)
        mm_inputs = prompt.get("mm_inputs") if isinstance(prompt, dict) else None  # built by the LLM / server
        return [
            EngineCoreRequest(
                child_id, token_ids,
                params.replace(n=1, seed=None if params.seed is None else params.seed + i),
                self.eos_token_ids, bad_words, arrival_time, mm_inputs=mm_inputs,
                prefill_addr=PREFILL_ADDR.get(),
            )
            for i, child_id in enumerate(child_ids)
        ]


def eos_token_ids_of(tokenizer: Any, model_eos: tuple[int, ...]) -> list[int]:
    """EOS ids from generation_config.json (via the tokenizer) and config.json."""
    eos = list(tokenizer.eos_token_ids or [])
    return eos + [t for t in model_eos if t not in eos]
