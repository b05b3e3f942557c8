"""RMSNorm hands a 16-bit weight to the backend as its cached fp32 copy."""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.layers.basic import RMSNorm
from fd_core.ops.norm import reference_rms_norm

paddle = import_paddle()


class _Ops:
    """Records the weight each call gets; computes the reference."""

    def __init__(self) -> None:
        self.weights: list[Any] = []

    def rms_norm(self, x: Any, weight: Any, eps: float, residual: Any | None) -> Any:
        self.weights.append(weight)
        return reference_rms_norm(x, weight, eps, residual)


def _norm(dtype: str) -> tuple[RMSNorm, _Ops]:
    ops = _Ops()
    norm = RMSNorm(ops, 8, 1e-5)  # type: ignore[arg-type]
    norm.weight.data = paddle.to_tensor(np.linspace(0.5, 2.0, 8, dtype=np.float32)).astype(dtype)
    return norm, ops


def test_a_16_bit_weight_goes_over_as_one_fp32_copy_with_the_same_results() -> None:
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32))
    residual = paddle.ones([3, 8])
    for dtype in ("bfloat16", "float16"):
        norm, ops = _norm(dtype)
        raw = norm.weight.data
        out, total = norm(x, residual)
        want, want_total = reference_rms_norm(x, raw, 1e-5, residual)
        assert np.array_equal(out.numpy(), want.numpy()) and np.array_equal(total.numpy(), want_total.numpy())
        assert np.array_equal(norm(x).numpy(), reference_rms_norm(x, raw, 1e-5).numpy())
        assert ops.weights[0].dtype == paddle.float32 and ops.weights[1] is ops.weights[0]  # made once
        assert np.array_equal(ops.weights[0].numpy(), raw.astype("float32").numpy())


def test_a_replaced_or_rewritten_weight_is_widened_again() -> None:
    x = paddle.ones([1, 8])
    norm, ops = _norm("bfloat16")
    norm(x)
    norm.weight.data = paddle.full([8], 3.0).astype("bfloat16")  # replaced
    norm(x)
    assert float(ops.weights[-1][0]) == 3.0
    paddle.assign(paddle.full([8], 5.0).astype("bfloat16"), norm.weight.data)  # written in place
    norm(x)
    assert float(ops.weights[-1][0]) == 5.0


def test_an_fp32_weight_goes_over_as_it_is() -> None:
    norm, ops = _norm("float32")
    norm(paddle.ones([2, 8]))
    assert ops.weights[0] is norm.weight.data
