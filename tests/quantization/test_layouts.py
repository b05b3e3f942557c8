"""quantize_weight / dequantize: the exact layouts native kernels read."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization import dequantize, quantize_weight

from . import numpy_ref as ref


def test_wint8_layout_rounding_and_zero_channel():
    # [in=4, out=2]; column 0 has max 127 -> scale 1, so codes are rint(W): half to even
    w = np.array([[127.0, 0.0], [-3.0, 0.0], [0.5, 0.0], [2.5, 0.0]], dtype=np.float32)
    q = quantize_weight("wint8", w)
    assert isinstance(q, QuantizedWeight)
    assert (q.method, q.in_features, q.out_features, q.group_size) == ("wint8", 4, 2, -1)
    assert q.qweight.dtype == paddle.int8 and q.qweight.shape == [2, 4]  # [out, in]
    assert q.scales.dtype == paddle.float32 and q.scales.shape == [2]
    np.testing.assert_array_equal(q.qweight.numpy(), [[127, -3, 0, 2], [0, 0, 0, 0]])
    np.testing.assert_array_equal(q.scales.numpy(), [1.0, 1.0])  # a zero column gets scale 1
    np.testing.assert_array_equal(dequantize(q).numpy(), [[127, 0], [-3, 0], [0, 0], [2, 0]])


def test_wint4_nibble_order_and_sign():
    # column 0 max 7 -> scale 1; column 1 max 14 -> scale 2
    w = np.array([[7.0, -14.0], [3.0, 8.0], [-7.0, 4.0], [2.0, 0.0]], dtype=np.float32)
    q = quantize_weight("wint4", w, group_size=-1)
    assert q.qweight.dtype == paddle.uint8 and q.qweight.shape == [2, 2]  # [out, in // 2]
    assert q.scales.shape == [2, 1] and q.group_size == -1
    # row 0 codes (7, 3, -7, 2): byte 0 = low 7 | high 3, byte 1 = low -7 (0x9) | high 2
    # row 1 codes (-7, 4, 2, 0): byte 0 = 0x9 | 4 << 4, byte 1 = 2 | 0 << 4
    np.testing.assert_array_equal(q.qweight.numpy(), [[0x37, 0x29], [0x49, 0x02]])
    np.testing.assert_array_equal(q.scales.numpy(), [[1.0], [2.0]])
    np.testing.assert_array_equal(dequantize(q).numpy(), w)


def test_wint4_group_scales_cover_consecutive_inputs():
    w = np.zeros((8, 1), dtype=np.float32)
    w[:4, 0] = [7, -7, 1, 0]  # group 0: max 7 -> scale 1
    w[4:, 0] = [0, 0.5, -3.5, 1]  # group 1: max 3.5 -> scale 0.5
    q = quantize_weight("wint4", w, group_size=4)
    assert q.scales.shape == [1, 2] and q.group_size == 4
    np.testing.assert_array_equal(q.scales.numpy(), [[1.0, 0.5]])
    np.testing.assert_array_equal(ref.unpack_int4(q.qweight.numpy()), [[7, -7, 1, 0, 0, 1, -7, 2]])


@pytest.mark.parametrize("method,group_size,qmax", [
    ("wint8", 128, 127), ("w8a8", 128, 127), ("wint4", 128, 7), ("wint4", 32, 7), ("wint4", -1, 7),
])
@pytest.mark.parametrize("d_in,d_out", [(256, 96), (64, 3), (96, 1)])
def test_round_trip_error_is_at_most_half_a_step(method, group_size, qmax, d_in, d_out):
    rng = np.random.default_rng(d_in + d_out)
    w = rng.normal(0, 0.05, (d_in, d_out)).astype(np.float32)
    w[:, 0] *= 100  # channels of very different range
    q = quantize_weight(method, paddle.to_tensor(w), group_size)  # a paddle tensor works too
    back = dequantize(q).numpy()
    assert back.shape == (d_in, d_out) and back.dtype == np.float32
    scales = q.scales.numpy().reshape(d_out, -1)
    step = np.repeat(scales, d_in // scales.shape[1], axis=1).T  # [in, out]
    assert np.all(np.abs(w - back) <= step / 2 * (1 + 1e-5) + 1e-12)
    # the scale is the channel (group) max over qmax: the extreme value is exact
    codes = (ref.unpack_int4(q.qweight.numpy()) if method == "wint4" else q.qweight.numpy())
    assert np.abs(codes).max(axis=1).tolist() == [qmax] * d_out
    want = ref.dequant_int4 if method == "wint4" else ref.dequant_int8
    np.testing.assert_array_equal(back, want(q.qweight.numpy(), q.scales.numpy()).astype(np.float32))


def test_wint4_groups_that_do_not_divide_in_fall_back_to_per_channel():
    w = np.random.default_rng(0).normal(size=(96, 8)).astype(np.float32)
    q = quantize_weight("wint4", w, group_size=64)  # 96 % 64 != 0
    assert q.group_size == -1 and q.scales.shape == [8, 1]
    q = quantize_weight("wint4", w, group_size=32)
    assert q.group_size == 32 and q.scales.shape == [8, 3]


def test_bad_inputs_are_named():
    w = np.ones((5, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="in_features must be even, got 5"):
        quantize_weight("wint4", w)
    with pytest.raises(ValueError, match=r"\[in, out\]"):
        quantize_weight("wint8", np.ones((2, 3, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="unknown quantization method 'int3'.*wint8"):
        quantize_weight("int3", w)
    with pytest.raises(ValueError, match="wint2.*not implemented"):
        quantize_weight("wint2", w)
