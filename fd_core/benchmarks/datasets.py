"""Benchmark prompts: ``random``, ``shared-prefix`` and ``sharegpt``.

- ``random``: prompts of random tokens, lengths uniform in
  ``[len * (1 - r), len * (1 + r)]`` (vLLM's ``--random-range-ratio``), after an
  optional ``--random-prefix-len`` prefix shared by all requests.
- ``shared-prefix``: ``--shared-prefix-num-groups`` system prompts of
  ``--shared-prefix-len`` random tokens, each request one of them (round robin)
  plus its own question of ``--random-input-len`` tokens: a prefix-cache load.
- ``sharegpt``: a ShareGPT JSON file; the first human turn is the prompt and the
  reply's length (or ``--sharegpt-output-len``) the output length. Entries too
  short (< 4 tokens) or too long (prompt > 1024, prompt + output > 2048) are
  skipped as in vLLM, when lengths are known.

With a tokenizer, random prompts are text decoded from random ordinary ids
(no special, added or byte-fallback tokens), trimmed so that re-encoding gives
about the wanted count, which is what the server will see. Without one they
are token-id lists (``/v1/completions`` accepts those), ids drawn from
``[100, --random-vocab-size)``.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DATASETS", "SampleRequest", "TokenSource", "add_dataset_args", "random_requests",
           "sample_requests", "sharegpt_requests", "shared_prefix_requests"]

DATASETS = ("random", "shared-prefix", "sharegpt")
_FIRST_PLAIN_ID = 100  # below this, vocabularies keep their special tokens
_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


@dataclass
class SampleRequest:
    prompt: str | list[int]
    prompt_len: int | None  # tokens; None when unknown (text without a tokenizer)
    output_len: int


class TokenSource:
    """Draws random ordinary token ids and renders them as a prompt."""

    def __init__(self, rng: np.random.Generator, tokenizer: Any = None, vocab_size: int = 1000):
        self.rng = rng
        self.tokenizer = tokenizer
        if tokenizer is None:
            if vocab_size <= _FIRST_PLAIN_ID:
                raise ValueError(f"--random-vocab-size must be > {_FIRST_PLAIN_ID}, got {vocab_size}")
            self.ids = np.arange(_FIRST_PLAIN_ID, vocab_size)
        else:
            skip = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens.values())
            pieces = tokenizer.convert_ids_to_tokens(range(len(tokenizer)))
            self.ids = np.array([i for i, p in enumerate(pieces)
                                 if i not in skip and not _BYTE_PIECE.match(p)])

    def draw(self, n: int) -> list[int]:
        return [int(i) for i in self.rng.choice(self.ids, size=n)] if n > 0 else []

    def render(self, prefix: list[int], ids: list[int]) -> tuple[str | list[int], int]:
        """(prompt, token count) for ``prefix + ids``; text is trimmed to about that count."""
        if self.tokenizer is None:
            return prefix + ids, len(prefix) + len(ids)
        target = len(prefix) + len(ids)
        for _ in range(4):  # decode -> encode changes the count a little; converge
            text = self.tokenizer.decode(prefix + ids)
            count = len(self.tokenizer.encode(text))
            if count == target:
                break
            if count > target:
                ids = ids[: max(len(ids) - (count - target), 0)]
            else:
                ids = ids + self.draw(target - count)
        return text, count


def _lengths(rng: np.random.Generator, mean: int, ratio: float, n: int, name: str) -> np.ndarray:
    if mean < 1:
        raise ValueError(f"--{name} must be >= 1, got {mean}")
    low, high = max(int(mean * (1 - ratio)), 1), max(int(mean * (1 + ratio)), 1)
    return rng.integers(low, high + 1, size=n)


def _check_ratio(ratio: float) -> None:
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {ratio}")


def random_requests(source: TokenSource, num: int, input_len: int, output_len: int,
                    range_ratio: float = 0.0, prefix_len: int = 0) -> list[SampleRequest]:
    """``num`` prompts: a shared prefix of ``prefix_len`` tokens + random tokens."""
    _check_ratio(range_ratio)
    if prefix_len < 0:
        raise ValueError(f"--random-prefix-len must be >= 0, got {prefix_len}")
    inputs = _lengths(source.rng, input_len, range_ratio, num, "random-input-len")
    outputs = _lengths(source.rng, output_len, range_ratio, num, "random-output-len")
    prefix = source.draw(prefix_len)
    out = []
    for n_in, n_out in zip(inputs, outputs):
        prompt, count = source.render(prefix, source.draw(int(n_in)))
        out.append(SampleRequest(prompt, count, int(n_out)))
    return out


def shared_prefix_requests(source: TokenSource, num: int, prefix_len: int, question_len: int,
                           output_len: int, range_ratio: float = 0.0,
                           num_groups: int = 1) -> list[SampleRequest]:
    """Request ``i`` is system prompt ``i % num_groups`` + its own question."""
    _check_ratio(range_ratio)
    if prefix_len < 1 or num_groups < 1:
        raise ValueError(f"--shared-prefix-len and --shared-prefix-num-groups must be >= 1, "
                         f"got {prefix_len} and {num_groups}")
    prefixes = [source.draw(prefix_len) for _ in range(num_groups)]
    questions = _lengths(source.rng, question_len, range_ratio, num, "random-input-len")
    outputs = _lengths(source.rng, output_len, range_ratio, num, "random-output-len")
    out = []
    for i, (n_q, n_out) in enumerate(zip(questions, outputs)):
        prompt, count = source.render(prefixes[i % num_groups], source.draw(int(n_q)))
        out.append(SampleRequest(prompt, count, int(n_out)))
    return out


def _first_exchange(entry: Any) -> tuple[str, str] | None:
    if not isinstance(entry, dict):
        return None
    turns = entry.get("conversations") or entry.get("conversation")
    if not isinstance(turns, list):
        return None
    for first, second in zip(turns, turns[1:]):
        if (isinstance(first, dict) and isinstance(second, dict)
                and first.get("from") in ("human", "user") and second.get("from") in ("gpt", "assistant")):
            prompt, reply = first.get("value"), second.get("value")
            if isinstance(prompt, str) and isinstance(reply, str):
                return prompt, reply
    return None


def sharegpt_requests(path: str | Path, num: int, rng: np.random.Generator, tokenizer: Any = None,
                      output_len: int | None = None) -> list[SampleRequest]:
    """``num`` prompts from a ShareGPT file, shuffled by ``rng``."""
    if tokenizer is None and output_len is None:
        raise ValueError("the sharegpt dataset needs --tokenizer to count reply tokens, "
                         "or a fixed --sharegpt-output-len")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read ShareGPT file {path}: {exc}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of {{'conversations': [...]}} entries")
    exchanges = [e for e in map(_first_exchange, data) if e is not None]
    out: list[SampleRequest] = []
    for i in rng.permutation(len(exchanges)):
        prompt, reply = exchanges[int(i)]
        prompt_len = len(tokenizer.encode(prompt)) if tokenizer is not None else None
        n_out = output_len or len(tokenizer.encode(reply))
        if output_len is None and prompt_len is not None and (
                prompt_len < 4 or n_out < 4 or prompt_len > 1024 or prompt_len + n_out > 2048):
            continue
        out.append(SampleRequest(prompt, prompt_len, n_out))
        if len(out) == num:
            return out
    raise ValueError(f"{path} has only {len(out)} usable conversations, fewer than "
                     f"--num-prompts {num}")


def add_dataset_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("dataset")
    a = g.add_argument
    a("--dataset-name", choices=DATASETS, default="random")
    a("--dataset-path", help="the ShareGPT JSON file (--dataset-name sharegpt)")
    a("--num-prompts", type=int, default=1000)
    a("--seed", type=int, default=0)
    a("--tokenizer", help="a model directory with fd-core tokenizer files; prompts become text "
                          "(serve: defaults to --model when that is a local checkpoint)")
    a("--random-input-len", type=int, default=1024, help="prompt (question) tokens")
    a("--random-output-len", type=int, default=128)
    a("--random-range-ratio", type=float, default=0.0,
      help="lengths uniform in [len*(1-r), len*(1+r)]")
    a("--random-prefix-len", type=int, default=0, help="tokens of a prefix shared by all prompts")
    a("--random-vocab-size", type=int, default=1000,
      help="without --tokenizer, token ids are drawn from [100, this)")
    a("--shared-prefix-len", type=int, default=512, help="system prompt tokens (shared-prefix)")
    a("--shared-prefix-num-groups", type=int, default=1, help="distinct system prompts")
    a("--sharegpt-output-len", type=int, default=None, help="fixed output length for sharegpt")


def sample_requests(args: argparse.Namespace, tokenizer: Any = None) -> list[SampleRequest]:
    """The requests the parsed dataset flags describe."""
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    rng = np.random.default_rng(args.seed)
    if args.dataset_name == "sharegpt":
        if not args.dataset_path:
            raise ValueError("--dataset-name sharegpt needs --dataset-path FILE.json")
        return sharegpt_requests(args.dataset_path, args.num_prompts, rng, tokenizer,
                                 args.sharegpt_output_len)
    source = TokenSource(rng, tokenizer, args.random_vocab_size)
    if args.dataset_name == "shared-prefix":
        return shared_prefix_requests(source, args.num_prompts, args.shared_prefix_len,
                                      args.random_input_len, args.random_output_len,
                                      args.random_range_ratio, args.shared_prefix_num_groups)
    return random_requests(source, args.num_prompts, args.random_input_len, args.random_output_len,
                           args.random_range_ratio, args.random_prefix_len)
