"""Benchmark prompts: ``random``, ``shared-prefix`` and ``sharegpt``.

- ``random``: prompts of random tokens, lengths uniform in
  ``[len * (1 - r), len * (1 + r)]`` (vLLM's ``--random-range-ratio``), after an
  optional ``--random-prefix-len`` prefix shared by all requests. Prompt and
  output lengths can instead come from independent inclusive ranges,
  ``--random-input-range LO:HI`` and ``--random-output-range LO:HI`` (vLLM and
  FastDeploy have only the shared ratio; each range replaces its side's
  ``--random-*-len`` and the ratio).
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
``[100, --random-vocab-size)``. ``keep_ids`` keeps token-id prompts even with a
tokenizer (ids then come from its ordinary vocabulary): what ``fd-bench
compare`` sends to every server.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DATASETS", "LengthRange", "SampleRequest", "TokenSource", "add_dataset_args",
           "check_length_range", "length_range_type", "random_requests", "sample_requests",
           "sharegpt_requests", "shared_prefix_requests"]

DATASETS = ("random", "shared-prefix", "sharegpt")
_FIRST_PLAIN_ID = 100  # below this, vocabularies keep their special tokens
_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN = 1024, 128
LengthRange = tuple[int, int]  # inclusive (LO, HI) token counts


@dataclass
class SampleRequest:
    prompt: str | list[int]
    prompt_len: int | None  # tokens; None when unknown (text without a tokenizer)
    output_len: int


class TokenSource:
    """Draws random ordinary token ids and renders them as a prompt."""

    def __init__(self, rng: np.random.Generator, tokenizer: Any = None, vocab_size: int = 1000,
                 keep_ids: bool = False):
        self.rng = rng
        self.tokenizer = tokenizer
        self.keep_ids = keep_ids
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
        if self.tokenizer is None or self.keep_ids:
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


def check_length_range(bounds: LengthRange, flag: str) -> LengthRange:
    """``bounds`` as ints when ``1 <= LO <= HI``; else ValueError naming ``flag``."""
    lo, hi = bounds
    if not (isinstance(lo, (int, np.integer)) and isinstance(hi, (int, np.integer))):
        raise ValueError(f"{flag} must be two integers LO:HI, got {bounds!r}")
    if not 1 <= lo <= hi:
        raise ValueError(f"{flag} must satisfy 1 <= LO <= HI, got {lo}:{hi}")
    return int(lo), int(hi)


def length_range_type(flag: str) -> Callable[[str], LengthRange]:
    """argparse ``type`` for ``LO:HI`` (or ``N`` for ``N:N``); argparse names ``flag`` on error."""

    def parse(text: str) -> LengthRange:
        lo, sep, hi = text.partition(":")
        try:
            bounds = (int(lo), int(hi if sep else lo))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected LO:HI with integers 1 <= LO <= HI (e.g. 128:512), got {text!r}") from None
        try:
            return check_length_range(bounds, flag)
        except ValueError as exc:  # argparse already names the flag
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{flag} ")) from None

    return parse


def _bounds(mean: int, ratio: float, given: LengthRange | None, name: str) -> LengthRange:
    """(LO, HI): ``given`` as is, else ``mean`` widened by ``ratio``."""
    if given is not None:
        return check_length_range(given, f"--{name.replace('-len', '-range')}")
    if mean < 1:
        raise ValueError(f"--{name} must be >= 1, got {mean}")
    return max(int(mean * (1 - ratio)), 1), max(int(mean * (1 + ratio)), 1)


def _lengths(rng: np.random.Generator, bounds: LengthRange, n: int) -> np.ndarray:
    return rng.integers(bounds[0], bounds[1] + 1, size=n)


def _check_ratio(ratio: float) -> None:
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {ratio}")


def random_requests(source: TokenSource, num: int, input_len: int, output_len: int,
                    range_ratio: float = 0.0, prefix_len: int = 0,
                    input_range: LengthRange | None = None,
                    output_range: LengthRange | None = None) -> list[SampleRequest]:
    """``num`` prompts: a shared prefix of ``prefix_len`` tokens + random tokens.

    Lengths are uniform in ``input_range`` / ``output_range`` when given, else in
    ``len * (1 -+ range_ratio)``; the two sides are drawn independently.
    """
    _check_ratio(range_ratio)
    if prefix_len < 0:
        raise ValueError(f"--random-prefix-len must be >= 0, got {prefix_len}")
    inputs = _lengths(source.rng, _bounds(input_len, range_ratio, input_range, "random-input-len"), num)
    outputs = _lengths(source.rng, _bounds(output_len, range_ratio, output_range, "random-output-len"), num)
    prefix = source.draw(prefix_len)
    out = []
    for n_in, n_out in zip(inputs, outputs):
        prompt, count = source.render(prefix, source.draw(int(n_in)))
        out.append(SampleRequest(prompt, count, int(n_out)))
    return out


def shared_prefix_requests(source: TokenSource, num: int, prefix_len: int, question_len: int,
                           output_len: int, range_ratio: float = 0.0, num_groups: int = 1,
                           question_range: LengthRange | None = None,
                           output_range: LengthRange | None = None) -> list[SampleRequest]:
    """Request ``i`` is system prompt ``i % num_groups`` + its own question."""
    _check_ratio(range_ratio)
    if prefix_len < 1 or num_groups < 1:
        raise ValueError(f"--shared-prefix-len and --shared-prefix-num-groups must be >= 1, "
                         f"got {prefix_len} and {num_groups}")
    prefixes = [source.draw(prefix_len) for _ in range(num_groups)]
    questions = _lengths(source.rng, _bounds(question_len, range_ratio, question_range, "random-input-len"), num)
    outputs = _lengths(source.rng, _bounds(output_len, range_ratio, output_range, "random-output-len"), num)
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
    a("--random-input-len", type=int, default=None,
      help=f"prompt (question) tokens (default {DEFAULT_INPUT_LEN})")
    a("--random-output-len", type=int, default=None, help=f"output tokens (default {DEFAULT_OUTPUT_LEN})")
    a("--random-range-ratio", type=float, default=0.0,
      help="lengths uniform in [len*(1-r), len*(1+r)], for both prompts and outputs")
    a("--random-input-range", type=length_range_type("--random-input-range"), default=None,
      metavar="LO:HI", help="prompt (question) tokens uniform in [LO, HI], drawn independently of "
                            "outputs; replaces --random-input-len and the ratio for prompts")
    a("--random-output-range", type=length_range_type("--random-output-range"), default=None,
      metavar="LO:HI", help="output tokens uniform in [LO, HI]; replaces --random-output-len "
                            "and the ratio for outputs")
    a("--random-prefix-len", type=int, default=0, help="tokens of a prefix shared by all prompts")
    a("--random-vocab-size", type=int, default=1000,
      help="without --tokenizer, token ids are drawn from [100, this)")
    a("--shared-prefix-len", type=int, default=512, help="system prompt tokens (shared-prefix)")
    a("--shared-prefix-num-groups", type=int, default=1, help="distinct system prompts")
    a("--sharegpt-output-len", type=int, default=None, help="fixed output length for sharegpt")


def _random_lengths(args: argparse.Namespace) -> dict[str, Any]:
    """Length keywords for the random generators; a flag that would be ignored is refused."""
    out: dict[str, Any] = {}
    for side, default in (("input", DEFAULT_INPUT_LEN), ("output", DEFAULT_OUTPUT_LEN)):
        length, bounds = getattr(args, f"random_{side}_len"), getattr(args, f"random_{side}_range")
        if length is not None and bounds is not None:
            raise ValueError(f"--random-{side}-len and --random-{side}-range exclude each other; "
                             "give one of them")
        out[f"{side}_len"] = default if length is None else length
        out[f"{side}_range"] = bounds
    if out["input_range"] is not None and out["output_range"] is not None and args.random_range_ratio:
        raise ValueError("--random-range-ratio has no effect with both --random-input-range and "
                         "--random-output-range; drop it")
    return out


def sample_requests(args: argparse.Namespace, tokenizer: Any = None,
                    keep_ids: bool = False) -> list[SampleRequest]:
    """The requests the parsed dataset flags describe; ``keep_ids``: token-id prompts always."""
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    rng = np.random.default_rng(args.seed)
    if args.dataset_name == "sharegpt":
        if not args.dataset_path:
            raise ValueError("--dataset-name sharegpt needs --dataset-path FILE.json")
        return sharegpt_requests(args.dataset_path, args.num_prompts, rng, tokenizer,
                                 args.sharegpt_output_len)
    source = TokenSource(rng, tokenizer, args.random_vocab_size, keep_ids)
    n = _random_lengths(args)
    if args.dataset_name == "shared-prefix":
        return shared_prefix_requests(source, args.num_prompts, args.shared_prefix_len,
                                      n["input_len"], n["output_len"], args.random_range_ratio,
                                      args.shared_prefix_num_groups, n["input_range"], n["output_range"])
    return random_requests(source, args.num_prompts, n["input_len"], n["output_len"],
                           args.random_range_ratio, args.random_prefix_len, n["input_range"],
                           n["output_range"])
