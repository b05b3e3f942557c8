"""The output processor takes several tokens of one output (multi-step decoding, speculative decoding) as it
takes them one an output: a stop string ends the text and the tokens at the token that completes it."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core import SamplingParams
from fd_core.engine.output_processor import OutputProcessor
from fd_core.engine.outputs import EngineCoreOutput, Logprob
from fd_core.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(checkpoint_factory):
    return load_tokenizer(checkpoint_factory("tiny-dense", "pytorch"))


def _feed(tokenizer, ids: list[int], params: SamplingParams, sizes: list[int]):
    """Hand ``ids`` to a fresh processor in outputs of ``sizes`` tokens (the last one finishes the request,
    "length"), stopping once a stop string ended it; the final output, the aborts asked for, and the
    generation-token count."""
    proc = OutputProcessor(tokenizer)
    (child,) = proc.add_request("r", None, [1, 2, 3], params)
    aborts, last, at = [], None, 0
    for size in sizes:
        chunk = ids[at:at + size]
        logprobs = [{t: Logprob(-0.25 * ((t + i) % 7) - 0.5)} for i, t in enumerate(chunk, start=at)]
        at += size
        out = EngineCoreOutput(child, chunk, new_logprobs=logprobs if params.logprobs is not None else None,
                               finish_reason="length" if at >= len(ids) else None)
        results, abort = proc.process([out])
        aborts += abort
        last = results[-1] if results else last
        metrics = last.metrics
        if last.finished:
            break
    o = last.outputs[0]
    return ((o.text, list(o.token_ids), o.finish_reason, o.stop_reason, o.logprobs, o.cumulative_logprob),
            aborts, metrics.num_generation_tokens)


def test_several_tokens_an_output_stop_where_one_token_an_output_does(tokenizer):
    rng = np.random.default_rng(0)
    stopped = 0
    for trial in range(300):
        ids = [int(t) for t in rng.integers(3, 2000, int(rng.integers(2, 40)))]
        text = tokenizer.decode(ids)
        stops = []
        for _ in range(int(rng.integers(1, 3))):
            a = int(rng.integers(0, max(1, len(text))))
            stops.append(text[a:a + int(rng.integers(1, 6))] or "#")
        if trial % 5 == 0:
            stops = ["\u2603 not in the text"]
        params = SamplingParams(max_tokens=64, stop=stops, include_stop_str_in_output=bool(trial % 2),
                                logprobs=0 if trial % 3 == 0 else None)
        want = _feed(tokenizer, ids, params, [1] * len(ids))
        sizes, left = [], len(ids)
        while left:
            sizes.append(min(left, int(rng.integers(1, 9))))
            left -= sizes[-1]
        got = _feed(tokenizer, ids, params, sizes)
        # the aborts differ where the stop came in the output that finished the request anyway
        assert (got[0], got[2]) == (want[0], want[2]), (ids, stops, sizes)
        stopped += want[0][2] == "stop"
    assert 100 < stopped < 300  # most trials meet a stop string, not all


def test_tokens_after_the_stop_string_are_dropped_and_the_request_aborted(tokenizer):
    ids = [int(t) for t in np.random.default_rng(1).integers(3, 2000, 12)]
    one = [tokenizer.decode(ids[:n]) for n in range(len(ids) + 1)]
    n = next(n for n in range(4, len(ids)) if one[n] != one[n - 1])  # token n - 1 adds text
    stop = one[n][len(one[n - 1]):]
    n = next(k for k in range(1, len(ids) + 1) if stop in one[k])  # the first token whose text holds it
    (text, token_ids, reason, stop_reason, _, _), aborts, count = _feed(
        tokenizer, ids, SamplingParams(max_tokens=64, stop=[stop]), [len(ids) - 1, 1])
    assert token_ids == ids[:n] and (reason, stop_reason) == ("stop", stop) and stop not in text
    assert aborts == ["r"] and count == n


def test_a_stop_string_inside_accepted_drafts_counts_only_the_kept_ones(tokenizer):
    """A verify step's output is its accepted drafts, then the target's token: cut by a stop string, the
    accepted count is that of the drafts kept (acceptance stays at most 1)."""
    ids = [int(t) for t in np.random.default_rng(2).integers(3, 2000, 6)]
    texts = [tokenizer.decode(ids[:n]) for n in range(len(ids) + 1)]
    n = next(n for n in range(2, len(ids)) if texts[n] != texts[n - 1])  # output token n - 1 (a draft) adds text
    stop = texts[n][len(texts[n - 1]):]
    n = next(k for k in range(1, len(ids) + 1) if stop in texts[k])
    proc = OutputProcessor(tokenizer)
    (child,) = proc.add_request("r", None, [1, 2, 3], SamplingParams(max_tokens=64, stop=[stop]))
    proc.process([EngineCoreOutput(child, ids[:1])])  # the prefill's token
    results, aborts = proc.process([EngineCoreOutput(child, ids[1:], num_draft_tokens=5, num_accepted_tokens=4)])
    m = results[-1].metrics
    assert list(results[-1].outputs[0].token_ids) == ids[:n] and aborts == ["r"]
    assert (m.num_generation_tokens, m.num_draft_tokens, m.num_accepted_tokens) == (n, 5, min(4, n - 1))
