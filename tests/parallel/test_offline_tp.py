"""Offline-quantized checkpoints (FP8, W4A8C8, 2Bits) under tensor and expert
parallelism: each rank loads exactly its slice of the stored codes and scales
(in process, no workers), slices off the stored packing are refused by name,
and TP=2 decodes the same greedy tokens as one rank (slow: spawns ranks; FP8
against a one-rank run that adds its row-parallel products as the ranks do)."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core._paddle import import_paddle
from fd_core.model_loader.loader import load_model
from fd_core.ops.linear import QuantizedWeight
from fd_core.parallel.expert_parallel import ExpertParallel
from fd_core.parallel.tensor_parallel import TensorParallel
from fd_core.quantization import dequantize
from fd_core.testing.quantized_checkpoints import generate_offline_checkpoint
from tests.parallel.greedy_runs import greedy_run

paddle = import_paddle()

# shapes whose TP=2 slices fall on each format's stored packing: fp8 128-blocks (head_dim 128,
# 256-wide MLPs), wint2's 128-input scale rows (moe_intermediate_size 256), int4 pairs
SHAPES = {
    "fp8": {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 128,
            "intermediate_size": 256, "moe_intermediate_size": 256},
    "w4a8c8": {},
    "2bits": {"hidden_size": 128, "moe_intermediate_size": 256},
}


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """fmt -> its offline checkpoint, generated once."""
    root = tmp_path_factory.mktemp("offline-tp")
    return {fmt: generate_offline_checkpoint(root / fmt, fmt, "tiny-moe", seed=1, **over)[1]
            for fmt, over in SHAPES.items()}


def _matrices(data) -> list[np.ndarray]:
    """A loaded parameter as float ``[in, out]`` matrices (one per expert when stacked)."""
    if isinstance(data, QuantizedWeight):
        if len(data.qweight.shape) == 3:
            return [dequantize(data.expert(e)).numpy() for e in range(int(data.qweight.shape[0]))]
        return [dequantize(data).numpy()]
    return [np.asarray(data.numpy(), dtype=np.float32)]


def _cut(full: np.ndarray, ranges, axis: int) -> np.ndarray:
    return np.concatenate([np.take(full, range(a, b), axis=axis) for a, b in ranges], axis=axis)


def _act_scales(data) -> np.ndarray:
    """w4a8_static: each expert's static activation maximum (fd-core keeps it per output column)."""
    return data.scales.numpy()[..., 1]


# W4A8C8 is published for 4 cards (-TP4): tiny-moe's 4 heads and 8 experts split 4 ways too
@pytest.mark.parametrize("fmt,world", [("fp8", 2), ("w4a8c8", 2), ("w4a8c8", 4), ("2bits", 2)])
@pytest.mark.parametrize("cls", [TensorParallel, ExpertParallel])
def test_each_rank_loads_the_slice_of_the_one_rank_weights(cpu_backend, offline, fmt, world, cls):
    ck = offline[fmt]
    one = load_model(ck, cpu_backend.ops, 64)
    one_params = one.parameters()
    seen_methods = set()
    for rank in range(world):
        transform = cls(rank, world)
        shard = load_model(ck, cpu_backend.ops, 64, transform=transform)
        params = shard.parameters()
        assert set(params) == set(one_params)
        for name, param in params.items():
            full, local = one_params[name].data, param.data
            if isinstance(local, QuantizedWeight):
                seen_methods.add(local.method)
                assert local.method == full.method, name
            split = transform.splits.get(name)
            experts = isinstance(transform, ExpertParallel) and ".experts." in name
            if experts:  # whole experts: this rank's [first, first + local)
                lo = transform.first_expert
                want = _matrices(full)[lo:lo + transform.local_experts]
            elif split is not None:  # split axis in [in, out] (or [E, in, out]) coordinates
                want = [_cut(m, split.kept, split.axis - (len(param.shape) - 2)) for m in _matrices(full)]
            else:  # replicated: norms, router, correction bias
                want = _matrices(full)
            got = _matrices(local)
            assert len(got) == len(want), name
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w, err_msg=f"{fmt} rank {rank} {name}")
            if isinstance(local, QuantizedWeight) and local.method == "w4a8_static":
                whole = _act_scales(full)
                if experts:
                    whole = whole[transform.first_expert:transform.first_expert + transform.local_experts]
                # one number per expert, taken whole by every rank whatever its columns
                np.testing.assert_array_equal(_act_scales(local)[..., 0], whole[..., 0], err_msg=name)
        if fmt == "w4a8c8":  # int8 KV static scales: the rank's KV heads' channels
            k0, k1 = transform.kv_channels(shard.config)
            for layer, (k, v) in shard.kv_cache_static_scales.items():
                full_k, full_v = one.kv_cache_static_scales[layer]
                np.testing.assert_array_equal(k.data.numpy(), full_k.data.numpy()[k0:k1])
                np.testing.assert_array_equal(v.data.numpy(), full_v.data.numpy()[k0:k1])
    want_methods = {"fp8": {"block_wise_fp8"}, "w4a8c8": {"wint8", "w4a8_static"},
                    "2bits": {"wint8", "wint4", "wint2"}}[fmt]
    assert seen_methods == want_methods


def test_kv_scales_follow_replicated_kv_heads(cpu_backend, offline):
    """4 ranks, 2 KV heads: ranks 0, 1 read head 0's channels, ranks 2, 3 head 1's."""
    ck = offline["w4a8c8"]
    one = load_model(ck, cpu_backend.ops, 64)
    dh = one.config.head_dim
    for rank in range(4):
        shard = load_model(ck, cpu_backend.ops, 64, transform=TensorParallel(rank, 4))
        head = rank * 2 // 4
        k, _ = shard.kv_cache_static_scales[0]
        np.testing.assert_array_equal(k.data.numpy(), one.kv_cache_static_scales[0][0].data.numpy()[
            head * dh:(head + 1) * dh])


def test_fp8_slice_off_a_128_block_is_refused_naming_it(cpu_backend, tmp_path):
    # tiny-moe: 4 heads of 16, so a TP=2 rank's query columns are 0..32 of 128: not whole blocks
    _, ck = generate_offline_checkpoint(tmp_path, "fp8", "tiny-moe", seed=1)
    with pytest.raises(ValueError, match=r"ernie\.layers\.0\.self_attn\.qkv_proj \(block_wise_fp8, 128 outputs\): "
                                         r"--tensor-parallel-size 2 gives rank 0 its output columns 0\.\.32.*"
                                         r"multiples of 128"):
        load_model(ck, cpu_backend.ops, 64, transform=TensorParallel(0, 2))


def test_wint2_slice_off_its_scale_rows_is_refused_naming_it(cpu_backend, tmp_path):
    # experts of 128 intermediate: a TP=2 rank's down_proj inputs 64..128 split a scale byte's two groups
    _, ck = generate_offline_checkpoint(tmp_path, "2bits", "tiny-moe", seed=1, hidden_size=128,
                                        moe_intermediate_size=128)
    with pytest.raises(ValueError, match=r"experts\.\d+\.down_proj \(wint2, 128 inputs\): --tensor-parallel-size 2 "
                                         r"gives rank 1 its input rows 64\.\.128"):
        load_model(ck, cpu_backend.ops, 64, transform=TensorParallel(1, 2))
    # expert parallelism keeps experts whole: the same checkpoint loads on 2 ranks
    load_model(ck, cpu_backend.ops, 64, transform=ExpertParallel(1, 2))


@pytest.mark.slow
def test_llm_at_tp2_refuses_an_fp8_slice_off_the_blocks(tmp_path):
    _, ck = generate_offline_checkpoint(tmp_path, "fp8", "tiny-moe", seed=1)
    with pytest.raises((ValueError, RuntimeError), match=r"qkv_proj \(block_wise_fp8, 128 outputs\): --tensor-parallel-size 2 gives "
                                        r"rank [01] its output columns"):
        greedy_run(ck, 2)


def _same_tokens(one, two) -> float:
    worst = 0.0
    for (tokens1, lps1), (tokens2, lps2) in zip(one, two):
        assert tokens2 == tokens1
        worst = max(worst, max(abs(a - b) for a, b in zip(lps1, lps2)))
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["w4a8c8", "2bits"])
def test_tp2_decodes_the_tokens_of_one_rank(offline, fmt):
    ck = offline[fmt]
    assert _same_tokens(greedy_run(ck, 1), greedy_run(ck, 2)) <= 1e-3


def _fp8_in_halves(hidden: int):
    """``block_wise_fp8``'s reference linear, but a row-parallel weight (``in`` != hidden: o_proj,
    down_proj, the experts' down) adds its two 128-input halves' products, as TP=2's all-reduce does."""
    from fd_core.quantization.block_fp8 import (
        _expand_scales,
        block_fp8_linear,
        decode_e4m3,
        quantize_activations_fp8,
    )

    def linear(x, quant):
        if quant.in_features == hidden:
            return block_fp8_linear(x, quant)
        half = quant.in_features // 2
        w = decode_e4m3(quant.qweight) * _expand_scales(quant.scales, quant.out_features, quant.in_features)
        parts = []
        for cols in (slice(0, half), slice(half, quant.in_features)):
            values, scales = quantize_activations_fp8(x[:, cols])
            parts.append(paddle.matmul(values * paddle.repeat_interleave(scales, 128, axis=1), w[:, cols],
                                       transpose_y=True))
        return (parts[0] + parts[1]).astype(x.dtype)

    return linear


@pytest.mark.slow
def test_fp8_tp2_decodes_the_tokens_of_one_rank_summing_as_tp_does(offline, monkeypatch):
    """fp8's per-block activation codes make a random model's greedy tokens turn on the order
    of fp32 sums (one device's 256-input dot products vs two ranks' 128-input ones added): the
    one-rank oracle adds its row-parallel products in the ranks' two halves, and TP=2 must
    match it exactly; every other input to the ranks is the one-rank model's."""
    from fd_core.quantization import reference

    ck = offline["fp8"]
    two = greedy_run(ck, 2)
    linear = _fp8_in_halves(SHAPES["fp8"]["hidden_size"])
    original = reference._linear_of
    monkeypatch.setattr(reference, "_linear_of",
                        lambda quant: linear if quant.method == "block_wise_fp8" else original(quant))
    assert _same_tokens(greedy_run(ck, 1), two) <= 1e-5


@pytest.mark.slow
def test_ep2_decodes_the_tokens_of_one_rank(offline):
    ck = offline["w4a8c8"]
    assert _same_tokens(greedy_run(ck, 1), greedy_run(ck, 2, enable_expert_parallel=True)) <= 1e-3
