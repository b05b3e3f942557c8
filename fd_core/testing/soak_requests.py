"""What the soak sends: a random mix of good generation requests, and hostile
ones that must be refused with a 4xx.

A good request is a ``Job``: the path, the JSON body, and what a correct
answer has (how many choices, whether logprobs / prompt_logprobs must be
there). Hostile requests are raw bytes (lone surrogates cannot go through a
UTF-8 JSON encoder) with a name saying what is wrong with them.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HOSTILE_NAMES", "Job", "hostile_request", "random_job"]

WORDS = ("the", "a", "cat", "sat", "on", "mat", "and", "then", "ran", "far", "away", "hello", "world",
         "soak", "test", "of", "fd", "core", "tokens", "stream")
STOPS = ("the", "a", "at", "\n", "on", "xyz")


@dataclass
class Job:
    """One good generation request and what its answer must hold."""

    path: str  # /v1/chat/completions or /v1/completions
    body: dict[str, Any]
    choices: int  # prompts x n
    logprobs: bool = False  # every choice carries logprobs
    prompt_logprobs: bool = False  # every choice carries prompt_logprobs, one entry per prompt token
    disconnect_after: int | None = None  # close the stream after this many events (we caused it)
    greedy_key: str | None = None  # set for temperature-0 requests: the same key must give the same text
    tags: list[str] = field(default_factory=list)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def random_job(rng: random.Random, model: str, disconnect_rate: float = 0.15) -> Job:
    """A good request with a random mix of the features a server must get right."""
    chat = rng.random() < 0.5
    n = rng.choice((1, 1, 1, 2, 3))
    stream = rng.random() < 0.5
    body: dict[str, Any] = {"model": model, "n": n, "stream": stream,
                            "max_tokens": rng.choice((1, 4, 8, 16, 32, 64)),
                            "ignore_eos": rng.random() < 0.5}
    tags = ["chat" if chat else "completions", "stream" if stream else "plain"]
    prompts = 1
    if chat:
        body["messages"] = [{"role": "user", "content": _text(rng, 1, 40)}]
        if rng.random() < 0.3:
            body["messages"].insert(0, {"role": "system", "content": _text(rng, 1, 10)})
    elif rng.random() < 0.2:
        prompts = rng.randint(2, 3)
        body["prompt"] = [_text(rng, 1, 30) for _ in range(prompts)]
        tags.append("prompts")
    elif rng.random() < 0.2:
        body["prompt"] = [rng.randint(5, 200) for _ in range(rng.randint(1, 60))]
        tags.append("token-ids")
    else:
        body["prompt"] = _text(rng, 1, 60)
    greedy = rng.random() < 0.3
    if greedy:
        body["temperature"] = 0.0
    else:
        body["temperature"] = rng.choice((0.5, 0.8, 1.0))
        body["top_p"] = rng.choice((0.9, 1.0))
        if rng.random() < 0.5:
            body["seed"] = rng.randint(0, 1000)
            tags.append("seeded")
    logprobs = rng.random() < 0.3
    if logprobs:
        if chat:
            body["logprobs"] = True
            body["top_logprobs"] = rng.randint(0, 5)
        else:
            body["logprobs"] = rng.randint(0, 5)
            body["echo"] = rng.random() < 0.3
        tags.append("logprobs")
    prompt_lp = not stream and rng.random() < 0.15
    if prompt_lp:
        body["prompt_logprobs"] = rng.randint(0, 3)
        body["return_token_ids"] = True
        tags.append("prompt_logprobs")
    if rng.random() < 0.25:
        body["stop"] = rng.sample(STOPS, rng.randint(1, 3))
        body["include_stop_str_in_output"] = rng.random() < 0.5
        tags.append("stop")
    if rng.random() < 0.1:
        body["min_tokens"] = min(body["max_tokens"], rng.randint(1, 8))
        body["stop_token_ids"] = [rng.randint(0, 200) for _ in range(rng.randint(1, 8))]
        body["bad_words"] = rng.sample(WORDS, 2)
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    job = Job("/v1/chat/completions" if chat else "/v1/completions", body, prompts * n,
              logprobs=logprobs, prompt_logprobs=prompt_lp, tags=tags)
    if stream and rng.random() < disconnect_rate:
        body["max_tokens"] = 200  # long enough that the disconnect lands mid-generation
        body["ignore_eos"] = True
        job.disconnect_after = rng.randint(1, 6)
    if greedy and n == 1 and job.disconnect_after is None:
        job.greedy_key = json.dumps({k: v for k, v in body.items() if k not in ("stream", "stream_options")},
                                    sort_keys=True)
    return job


def _raw(body: str, model: str = "") -> bytes:
    """``body`` is JSON text already (it may carry \\ud800 escapes: lone surrogates);
    MODEL in it stands for the JSON-quoted ``model``."""
    return body.replace("MODEL", model).encode("ascii")


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=True).encode("ascii")


def _hostile_cases(model: str, max_model_len: int, max_body_bytes: int) -> dict[str, tuple[str, bytes, dict]]:
    """name -> (path, body bytes, extra headers)."""
    chat, comp = "/v1/chat/completions", "/v1/completions"
    msg = [{"role": "user", "content": "hi"}]
    base_c = {"model": model, "prompt": "hi", "max_tokens": 4}
    base_ch = {"model": model, "messages": msg, "max_tokens": 4}
    m = json.dumps(model)
    return {
        # wrong types
        "max_tokens-true": (comp, _dump({**base_c, "max_tokens": True}), {}),
        "stream-yes": (chat, _dump({**base_ch, "stream": "yes"}), {}),
        "n-string": (comp, _dump({**base_c, "n": "2"}), {}),
        "temperature-list": (chat, _dump({**base_ch, "temperature": [1]}), {}),
        "messages-string": (chat, _dump({"model": model, "messages": "hi"}), {}),
        "message-role-int": (chat, _dump({"model": model, "messages": [{"role": 5, "content": "x"}]}), {}),
        "prompt-dict": (comp, _dump({**base_c, "prompt": {"a": 1}}), {}),
        "stop-int": (comp, _dump({**base_c, "stop": 7}), {}),
        "body-list": (comp, _dump([base_c]), {}),
        "body-not-json": (comp, b'{"model": "x", "prompt": ', {}),
        "body-empty": (comp, b"", {}),
        # beyond the documented limits
        "stop-65": (comp, _dump({**base_c, "stop": [f"s{i}" for i in range(65)]}), {}),
        "bad_words-5000": (comp, _dump({**base_c, "bad_words": [f"w{i}" for i in range(5000)]}), {}),
        "bad_words_token_ids-200k": (comp, _dump({**base_c, "bad_words_token_ids": list(range(200_000))}), {}),
        "stop_token_ids-300k": (chat, _dump({**base_ch, "min_tokens": 2, "stop_token_ids": [7] * 300_000}), {}),
        "n-129": (comp, _dump({**base_c, "n": 129}), {}),
        "fan-out-20x128": (comp, _dump({**base_c, "prompt": ["x"] * 20, "n": 128}), {}),
        "logprobs-21": (comp, _dump({**base_c, "logprobs": 21}), {}),
        "top_logprobs-21": (chat, _dump({**base_ch, "logprobs": True, "top_logprobs": 21}), {}),
        "max_tokens-over-len": (comp, _dump({**base_c, "max_tokens": max_model_len + 1}), {}),
        "prompt-ids-over-len": (comp, _dump({**base_c, "prompt": [5] * (max_model_len + 8)}), {}),
        "prompt-text-over-len": (comp, _dump({**base_c, "prompt": "word " * (max_model_len * 4)}), {}),
        "body-over-limit": (comp, _dump({**base_c, "prompt": "x" * (max_body_bytes + 1)}), {}),
        "content-length-over-limit": (comp, _dump(base_c), {"Content-Length": str(max_body_bytes + 1)}),
        "tokenize-over-len": ("/tokenize", _dump({"model": model, "prompt": "word " * (max_model_len * 8)}), {}),
        # lone UTF-16 surrogates
        "surrogate-content": (chat, _raw('{"model": MODEL, "messages": [{"role": "user", "content": "a\\ud800b"}]}', m), {}),
        "surrogate-prompt": (comp, _raw('{"model": MODEL, "prompt": "a\\udfffb", "max_tokens": 2}', m), {}),
        "surrogate-model": (comp, _raw('{"model": "t\\ud800", "prompt": "x", "max_tokens": 2}'), {}),
        "surrogate-bad_words": (comp, _raw('{"model": MODEL, "prompt": "x", "bad_words": ["\\ud800"]}', m), {}),
        "surrogate-stop": (comp, _raw('{"model": MODEL, "prompt": "x", "stop": ["\\udc00"]}', m), {}),
        "surrogate-request_id": (comp, _raw('{"model": MODEL, "prompt": "x", "request_id": "r\\ud800"}', m), {}),
        "surrogate-request_id-stream": (chat, _raw('{"model": MODEL, "messages": [{"role": "user", "content": "x"}],'
                                                   ' "stream": true, "request_id": "r\\ud800"}', m), {}),
        "surrogate-tokenize": ("/tokenize", _raw('{"model": MODEL, "prompt": "a\\ud800"}', m), {}),
        # unknown fields
        "unknown-top": (comp, _dump({**base_c, "frobnicate": 1}), {}),
        "unknown-stream_options": (chat, _dump({**base_ch, "stream": True,
                                                "stream_options": {"include_usage": True, "zzz": 1}}), {}),
        "unknown-model": (comp, _dump({**base_c, "model": "no-such-model"}), {}),
    }


HOSTILE_NAMES = tuple(_hostile_cases("m", 16, 1024))


@functools.lru_cache(maxsize=4)
def _cached_cases(model: str, max_model_len: int, max_body_bytes: int) -> dict[str, tuple[str, bytes, dict]]:
    return _hostile_cases(model, max_model_len, max_body_bytes)


def hostile_request(name: str, model: str, max_model_len: int, max_body_bytes: int) -> tuple[str, bytes, dict]:
    """(path, body, headers) of the hostile case ``name`` (one of HOSTILE_NAMES); a
    ``Content-Length`` header, when given, replaces the body's true length."""
    return _cached_cases(model, max_model_len, max_body_bytes)[name]
