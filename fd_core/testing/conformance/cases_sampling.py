"""Sampling: greedy rows equal the reference exactly; sampled rows draw from
the filtered set (temperature, min-p, top-k, top-p); with the "sort" method
and the same uniforms they draw the reference's very tokens."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core._paddle import import_paddle
from fd_core.ops.sampling import filtered_probs
from fd_core.testing.conformance.harness import Harness, case_rng

paddle = import_paddle()

# (temperature, top_k, top_p, min_p) per row, cycled over the batch.
ROW_SETTINGS = [
    (1.0, 0, 0.9, 0.0),  # top-p
    (0.0, 0, 1.0, 0.0),  # greedy
    (1.0, 0, 1.0, 0.0),  # unfiltered
    (0.7, 50, 1.0, 0.0),  # top-k
    (1.3, 20, 0.8, 0.0),  # top-k and top-p
    (0.0, 5, 0.5, 0.1),  # greedy: filters are ignored
    (0.9, 0, 1.0, 0.05),  # min-p
    (1.0, 1, 1.0, 0.0),  # top-k 1 is greedy by filtering
    (1.1, 1000, 0.95, 0.02),  # all three
]
NUM_UNIFORMS = 16  # columns of uniforms; "sort" uses the first
CDF_MARGIN = 1e-4  # "sort" uniforms are kept this far from every CDF step
SLACK = 1e-4  # top-p/min-p loosening for "inside the filtered set" (rounding at the edge)


def _rows(batch: str) -> list[tuple[float, int, float, float]]:
    if batch == "greedy-only":
        return [(0.0, 0, 1.0, 0.0)] * 4
    size = int(batch)
    return [ROW_SETTINGS[i % len(ROW_SETTINGS)] for i in range(size)]


def _host_filter(fd: Harness, logits: np.ndarray, settings: np.ndarray,
                 slack: float) -> tuple[np.ndarray, np.ndarray]:
    """The reference's filtered distribution: (kept probs in sorted order,
    sorted token ids), with top-p and min-p loosened by ``slack``."""
    temp, top_k, top_p, min_p = settings.T
    with fd.on_host():
        t = np.where(temp > 0, temp, 1.0).astype(np.float32)
        probs = paddle.nn.functional.softmax(fd.host(logits) / fd.host(t).unsqueeze(-1), axis=-1)
        kept, ids = filtered_probs(
            probs, fd.host(top_k.astype(np.int64)),
            fd.host(np.minimum(top_p + slack, 1.0)), fd.host(min_p * (1 - slack)),
        )
    return kept.numpy(), ids.numpy()


def _uniforms(rng: np.random.Generator, kept: np.ndarray) -> np.ndarray:
    """Uniforms whose first column stays clear of every step of each row's CDF,
    so rounding differences between devices cannot change a "sort" draw."""
    u = rng.uniform(0, 1, (kept.shape[0], NUM_UNIFORMS)).astype(np.float32)
    for row in range(kept.shape[0]):
        cdf = np.cumsum(kept[row].astype(np.float64))
        steps = cdf[cdf < cdf[-1]] / cdf[-1]
        while steps.size and np.abs(steps - u[row, 0]).min() < CDF_MARGIN:
            u[row, 0] = rng.uniform(0, 1)
    return np.minimum(u, np.float32(1 - 2**-24))


@pytest.mark.parametrize("method", ["sort", "rejection"])
@pytest.mark.parametrize("batch,vocab", [("1", 1000), ("9", 32003), ("greedy-only", 1027),
                                         ("18", 1000)])
def test_sample(conformance: Harness, method: str, batch: str, vocab: int) -> None:
    fd = conformance
    rng = case_rng("sample", method, batch, vocab)
    settings = np.asarray(_rows(batch), dtype=np.float64)
    rows = settings.shape[0]
    logits = rng.normal(0, 4, (rows, vocab)).astype(np.float32)
    temp, top_k, top_p, min_p = settings.T
    strict_kept, strict_ids = _host_filter(fd, logits, settings, 0.0)
    uniforms = _uniforms(rng, strict_kept)
    case = f"logits[{rows}, {vocab}] method={method} batch={batch}"
    args = {
        "temperature": temp.astype(np.float32), "top_k": top_k.astype(np.int64),
        "top_p": top_p.astype(np.float32), "min_p": min_p.astype(np.float32), "uniforms": uniforms,
    }
    got = fd.call("sample", logits=fd.device(logits, "float32"), method=method,
                  **{k: fd.device(v, "float32" if v.dtype == np.float32 else None)
                     for k, v in args.items()})
    want = fd.call_reference("sample", logits=fd.host(logits), method=method,
                             **{k: fd.host(v) for k, v in args.items()})
    got_np, want_np = fd.numpy(got), fd.numpy(want)
    if got_np.shape != (rows,) or got_np.dtype != np.int64:
        raise AssertionError(
            f"sample [{case}] ({fd.who('sample')}): returned {got_np.dtype} {list(got_np.shape)}, "
            f"expected int64 [{rows}]"
        )
    greedy = temp == 0
    fd.assert_equal("sample", case + " (greedy rows)", got_np[greedy], want_np[greedy])
    loose_kept, loose_ids = _host_filter(fd, logits, settings, SLACK)
    for row in np.nonzero(~greedy)[0]:
        allowed = set(loose_ids[row][loose_kept[row] > 0].tolist())
        if int(got_np[row]) not in allowed:
            raise AssertionError(
                f"sample [{case}] ({fd.who('sample')}): row {row} "
                f"(temperature={temp[row]:g} top_k={int(top_k[row])} top_p={top_p[row]:g} "
                f"min_p={min_p[row]:g}) drew token {int(got_np[row])}, outside the filtered "
                f"set of {len(allowed)} tokens"
            )
    if method == "sort":
        fd.assert_equal("sample", case + " (sampled rows, same uniforms)",
                        got_np[~greedy], want_np[~greedy])


@pytest.mark.parametrize("rows,vocab,masked", [(1, 1000, [0]), (9, 32003, [8, 0, 3]), (4, 70, [1, 2])])
def test_apply_token_bitmask(conformance: Harness, rows: int, vocab: int, masked: list[int]) -> None:
    """Structured output's mask: the tokens whose bit is clear (and the columns past
    the mask) are -inf in the named rows, every other logit is unchanged."""
    fd = conformance
    rng = case_rng("apply_token_bitmask", rows, vocab)
    logits = rng.normal(0, 4, (rows, vocab)).astype(np.float32)
    words = max(1, (vocab - 40) // 32)  # may stop short of the vocabulary: the rest is forbidden
    bitmask = rng.integers(-2**31, 2**31, size=(len(masked), words), dtype=np.int64).astype(np.int32)
    case = f"logits[{rows}, {vocab}] rows={masked} mask words={words}"
    got = fd.numpy(fd.call("apply_token_bitmask", logits=fd.device(logits, "float32"), bitmask=bitmask,
                           rows=masked))
    want = fd.numpy(fd.call_reference("apply_token_bitmask", logits=fd.host(logits.copy()), bitmask=bitmask,
                                      rows=masked))
    fd.assert_equal("apply_token_bitmask", case, got, want)
