"""Quantized TP=2 against quantized TP=1 under the fp32 rule: greedy tokens equal,
logprobs within 1e-3. A row-parallel rank quantizes its rows with the whole column's
scales (``QuantizedParam.amax_reduce``); w8a8's row-parallel activations are
quantized with the whole token's scale."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.quantization.param import QuantizedParam
from fd_core.quantization.weights import quantize_array
from tests.parallel.greedy_runs import greedy_run

_run = greedy_run


def _max_diff(one, two) -> float:
    worst = 0.0
    for (tokens1, lps1), (tokens2, lps2) in zip(one, two):
        assert tokens2 == tokens1
        worst = max(worst, max(abs(a - b) for a, b in zip(lps1, lps2)))
    return worst


@pytest.mark.parametrize("method", ["wint8", "w8a8", "wint4"])
def test_quantized_tp2_matches_quantized_tp1_dense(checkpoint_factory, method):
    model = checkpoint_factory("tiny-dense", "pytorch")
    quant = method if method != "wint4" else {"quantization": "mix_quant", "dense_quant_type": "wint4",
                                              "moe_quant_type": "wint4", "group_size": -1}
    assert _max_diff(_run(model, 1, quantization=quant), _run(model, 2, quantization=quant)) <= 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("method", ["wint8", "w8a8", "wint4"])
def test_quantized_tp2_matches_quantized_tp1_moe(checkpoint_factory, method):
    model = checkpoint_factory("tiny-moe", "paddle")
    assert _max_diff(_run(model, 1, quantization=method), _run(model, 2, quantization=method)) <= 1e-3


@pytest.mark.parametrize("method,group", [("wint8", -1), ("w8a8", -1), ("wint4", -1), ("wint4", 4)])
def test_row_slices_quantized_with_the_column_maxima_equal_the_whole_matrix(method, group):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 6)).astype(np.float32)
    weight[3, 2] = 9.0  # one channel's maximum lives in the first half only
    whole_q, whole_s, _ = quantize_array(method, weight, group)
    halves = []
    for rows in (slice(0, 8), slice(8, 16)):
        param = QuantizedParam((8, 6), method, group)
        param.amax_reduce = lambda amax: np.abs(weight).max(axis=0).astype(np.float32)
        param.set(weight[rows])
        halves.append(param.data)
    cols = 1 if method == "wint4" else 1  # codes [out, in(/2)]: the halves are the input columns
    np.testing.assert_array_equal(np.concatenate([h.qweight.numpy() for h in halves], axis=cols), whole_q)
    if group == -1:
        for h in halves:
            np.testing.assert_array_equal(h.scales.numpy(), whole_s)
    else:  # whole groups on each rank: the groups' own scales, as one device's
        np.testing.assert_array_equal(np.concatenate([h.scales.numpy() for h in halves], axis=1), whole_s)
