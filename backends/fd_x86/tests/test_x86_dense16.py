"""fd_x86.dense16: bf16 / fp16 / fp32 weights in the reference's layout against
``reference_linear``, per kernel, on odd shapes and thread counts.

Tolerances, relative to ``|x| @ |W|`` (the bound's natural scale):
stream and panel (exact fp32 products, fp32 sums in another order): 1e-5, and
the panel kernel gives the stream kernel's bits from 2 rows;
bf16 GEMM (x rounded to bf16): ``GEMM_REL_ERR`` = 2^-9, plus the same 1e-5.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fd_x86.cpu import AMX_BF16_FLAGS, AVX512_BF16_FLAG, AVX512_FLAGS, cpu_features

paddle = pytest.importorskip("paddle")

import fd_x86.dense16 as dense16  # noqa: E402
from fd_x86.dense16 import (  # noqa: E402
    GEMM_MIN_ROWS,
    GEMM_REL_ERR,
    PANEL_MAX_N,
    PANEL_MIN_ROWS,
    dense16_linear,
)

from fd_core.ops.linear import reference_linear  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_features().has(*AVX512_FLAGS), reason="no AVX-512 F/BW/VL/DQ on this CPU")
_NO_BF16_DOT = pytest.mark.skipif(not cpu_features().has(AVX512_BF16_FLAG), reason="no avx512_bf16 on this CPU")

ROWS = (1, 2, 3, 7, 8, 17, 64, 129)
SHAPES = [(40, 72), (72, 1000), (1000, 40), (33, 17)]  # (K, N): K odd / not of 16, N not of 16 / 64
STREAM_TOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def _ops() -> None:
    from fd_x86.build import load_ops

    load_ops()  # builds once per key (~30 s), then cached


def _case(rows: int, k: int, n: int, dtype: str, seed: int, bias: bool = True) -> tuple:
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.normal(0, 1, (rows, k)).astype(np.float32))
    w = paddle.to_tensor(rng.normal(0, k**-0.5, (k, n)).astype(np.float32)).astype(dtype)
    b = paddle.to_tensor(rng.normal(0, 1, n).astype(np.float32)).astype(dtype) if bias else None
    scale = np.abs(x.numpy()) @ np.abs(w.astype("float32").numpy())  # sum_k |x_k w_k|, per output
    return x, w, b, scale


def _dense(x: Any, w: Any, b: Any | None = None, **kwargs: Any) -> Any:
    out = dense16_linear(x, w, b, **kwargs)
    assert out is not None, "dense16 declined a bf16 / fp16 CPU weight"
    return out


def _check(got, want, scale: np.ndarray, rel: float) -> None:
    err = np.abs(got.numpy() - want.numpy())
    assert got.shape == want.shape
    assert np.all(err <= rel * scale + 1e-6), f"max error / scale = {np.max(err / (scale + 1e-30)):.3g} > {rel:.3g}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k,n", SHAPES)
def test_stream_and_panel_kernels_match_reference(dtype: str, rows: int, k: int, n: int) -> None:
    """Both within fp32 summation order of the reference; from 2 rows the panel kernel's bits are the
    stream kernel's (each output's FMAs over k in order, whatever the tiles)."""
    x, w, b, scale = _case(rows, k, n, dtype, seed=rows * 31 + k)
    want = reference_linear(x, w, b)
    for threads in (1, 2):
        stream = _dense(x, w, b, kernel="stream", threads=threads)
        _check(stream, want, scale, STREAM_TOL)
        panel = _dense(x, w, b, kernel="panel", threads=threads)
        _check(panel, want, scale, STREAM_TOL)
        if rows >= 2:
            np.testing.assert_array_equal(panel.numpy(), stream.numpy())


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("kernel", ["panel", "gemm"])
def test_a_narrow_weight_splits_the_rows_over_the_threads(dtype: str, kernel: str) -> None:
    """Fewer 64-output tiles than threads (a MoE router's [1024, 64]): the threads take rows instead, with
    every output's sum in the same order, so the bits equal one thread's."""
    if kernel == "gemm" and (dtype != "bfloat16" or not cpu_features().has(AVX512_BF16_FLAG)):
        pytest.skip("the bf16 GEMM takes bf16 weights on avx512_bf16 CPUs")
    x, w, _, scale = _case(300, 1024, 64, dtype, seed=3, bias=False)
    one = _dense(x, w, kernel=kernel, threads=1)
    for threads in (2, 3, 7):
        np.testing.assert_array_equal(_dense(x, w, kernel=kernel, threads=threads).numpy(), one.numpy())
    tol = STREAM_TOL + (GEMM_REL_ERR if kernel == "gemm" else 0.0)
    _check(one, reference_linear(x, w), scale, tol)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("k,n,threads", [(1024, 1100, 2), (1024, 1100, 3), (3, 400_000, 4), (515, 2048, 2),
                                         (13, 2048, 1)])
def test_one_row_splits_the_inputs_over_the_threads(dtype: str, k: int, n: int, threads: int) -> None:
    """At one row each thread sums a contiguous run of W's rows and the partials are added in thread
    order (K = 3 on 4 threads: 3 runs); with the bias, within the stream tolerance. On one thread the
    sum is the one every row of a 2-row call gets, bit for bit: a pass over 4 or 8 rows of W (runs
    of 1024 / 3 and 13 rows leave a tail) keeps the FMAs in k order."""
    x, w, b, scale = _case(2, k, n, dtype, seed=k + n + threads)
    want = reference_linear(x[:1], w, b)
    got = _dense(x[:1], w, b, kernel="stream", threads=threads)
    _check(got, want, scale[:1], STREAM_TOL)
    one = _dense(x[:1], w, b, kernel="stream", threads=1)
    np.testing.assert_array_equal(one.numpy()[0], _dense(x, w, b, kernel="stream", threads=1).numpy()[0])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("rows,k,n,threads", [(2, 1024, 1100, 2), (3, 515, 40_000, 2), (4, 13, 2048, 3),
                                              (4, 3, 400, 4), (2, 1024, 1100, 1)])
def test_few_rows_split_the_inputs_over_the_threads(dtype: str, rows: int, k: int, n: int, threads: int) -> None:
    """2-4 rows: each thread sums a run of W's rows for every row of x (N in slabs: 40000 outputs at 3 rows
    take two), the runs added in order; within the stream tolerance of the reference, and on one thread
    the panel kernel's bits (k in order), run tails and all."""
    x, w, b, scale = _case(rows, k, n, dtype, seed=rows * 31 + k + n + threads)
    got = _dense(x, w, b, kernel="stream", threads=threads)
    _check(got, reference_linear(x, w, b), scale, STREAM_TOL)
    np.testing.assert_array_equal(_dense(x, w, b, kernel="stream", threads=1).numpy(),
                                  _dense(x, w, b, kernel="panel", threads=1).numpy())


@pytest.mark.parametrize("rows,k,n,threads", [(5, 37, 14000, 2), (8, 1000, 1100, 2), (11, 300, 2000, 3),
                                              (23, 515, 3000, 2), (9, 33, 7, 1), (16, 70, 48, 4), (40, 129, 2000, 2)])
def test_fp32_direct_tiles_match_the_panels(rows: int, k: int, n: int, threads: int) -> None:
    """fp32 from 5 rows on the stream kernel: tiles of up to 8 rows x 48 outputs over chunks of W's rows
    (16 at one row tile, 128 from two), N in slabs of 64K outputs over all rows (14000 outputs at 5 rows,
    3000 at 23, 2000 at 40: two slabs or more; 7 outputs: one masked block), the accumulators through
    ``out`` between chunks (K = 37, 300, 515, 129: a tail chunk); within the stream tolerance of the
    reference and the panel kernel's bits on any thread count."""
    x, w, b, scale = _case(rows, k, n, "float32", seed=rows * 7 + k + n)
    got = _dense(x, w, b, kernel="stream", threads=threads)
    _check(got, reference_linear(x, w, b), scale, STREAM_TOL)
    np.testing.assert_array_equal(got.numpy(), _dense(x, w, b, kernel="panel", threads=1).numpy())
    np.testing.assert_array_equal(_dense(x, w, None, kernel="stream", threads=threads).numpy(),
                                  _dense(x, w, None, kernel="panel", threads=threads).numpy())


@_NO_BF16_DOT
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k,n", SHAPES)
def test_bf16_gemm_within_stated_bound(rows: int, k: int, n: int) -> None:
    x, w, b, scale = _case(rows, k, n, "bfloat16", seed=rows * 17 + n)
    want = reference_linear(x, w, b)
    for threads in (1, 2):
        _check(_dense(x, w, b, kernel="gemm", threads=threads), want, scale, GEMM_REL_ERR + STREAM_TOL)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("rows", [GEMM_MIN_ROWS - 1, GEMM_MIN_ROWS])
def test_auto_runs_the_gemm_from_its_threshold_for_bf16_only(dtype: str, rows: int) -> None:
    """From the threshold "auto" hands the choice to the op (the one fd_x86_decoder_layers makes): the
    vdpbf16ps GEMM, or AMX-BF16 where the CPU has it, which agrees with the GEMM to fp32 summation order."""
    x, w, b, _ = _case(rows, 72, 1000, dtype, seed=5)
    gemm = dtype == "bfloat16" and rows >= GEMM_MIN_ROWS and cpu_features().has(AVX512_BF16_FLAG)
    expected = _dense(x, w, b, kernel="gemm" if gemm else "stream", threads=1)
    got = _dense(x, w, b, threads=1).numpy()
    if gemm and cpu_features().has(*AMX_BF16_FLAGS) and os.environ.get("FD_X86_AMX") != "0":
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, expected.numpy())


def test_threshold_matches_the_c_kernels() -> None:
    header = (Path(dense16.__file__).parent / "csrc" / "kernels.h").read_text()
    assert re.search(rf"kDense16GemmMinRows = {GEMM_MIN_ROWS};", header)
    assert re.search(rf"kDense16PanelMinRows = {PANEL_MIN_ROWS}, kDense16PanelMaxN = {PANEL_MAX_N};", header)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("rows", [1, PANEL_MIN_ROWS - 1, PANEL_MIN_ROWS, GEMM_MIN_ROWS - 1, GEMM_MIN_ROWS])
@pytest.mark.parametrize("n", [PANEL_MAX_N, PANEL_MAX_N + 1])
def test_the_op_and_python_choose_alike(dtype: str, rows: int, n: int) -> None:
    """The op's own choice (kernel 0, as a fused run makes it) and dense16_linear's give the same bits, on
    both sides of every threshold. Stream and panel agree bit for bit from 2 rows, so this catches the two
    sides disagreeing about the bf16 GEMM (a different rounding) or the one-row split, not stream vs panel
    (a speed difference only; ``test_the_kernel_choice_by_rows_dtype_and_width`` pins Python's rules)."""
    from fd_x86.build import load_ops

    x, w, _, _ = _case(rows, 24, n, dtype, seed=rows + n, bias=False)
    for threads in (1, 2):
        np.testing.assert_array_equal(load_ops().fd_x86_dense16_linear(x, w, threads, 0).numpy(),
                                      _dense(x, w, threads=threads).numpy())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_kernel_choice_by_rows_dtype_and_width(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's choice (kernels.h's dense16_kernel, which the runs make): stream at one row and below
    PANEL_MIN_ROWS (16 since session 19, as GEMM_MIN_ROWS), panel from there; bf16 from GEMM_MIN_ROWS
    goes to the op's GEMM ("auto"), or to the panels without avx512_bf16; a 16-bit weight wider than
    PANEL_MAX_N (the LM head) would stay on the stream kernel below GEMM_MIN_ROWS (no row count now); an fp32
    weight stays on the stream kernel (its direct tiles) at every row count since session 20."""
    assert PANEL_MIN_ROWS == GEMM_MIN_ROWS == 16
    monkeypatch.setattr(dense16, "_has_bf16_dot", lambda: True)
    choose = dense16._kernel
    fp32 = dtype == "float32"
    gemm_or_panel = "stream" if fp32 else "auto" if dtype == "bfloat16" else "panel"
    assert choose(1, f"paddle.{dtype}", 64) == "stream"
    assert choose(8, f"paddle.{dtype}", 64) == "stream"  # the panels from 8 rows until session 19
    assert choose(PANEL_MIN_ROWS - 1, f"paddle.{dtype}", PANEL_MAX_N + 1) == "stream"
    assert choose(PANEL_MIN_ROWS, f"paddle.{dtype}", PANEL_MAX_N) == gemm_or_panel
    assert choose(PANEL_MIN_ROWS, f"paddle.{dtype}", PANEL_MAX_N + 1) == gemm_or_panel
    assert choose(4096, f"paddle.{dtype}", 64) == gemm_or_panel
    monkeypatch.setattr(dense16, "_has_bf16_dot", lambda: False)
    assert choose(GEMM_MIN_ROWS, f"paddle.{dtype}", 64) == ("stream" if fp32 else "panel")
    assert choose(GEMM_MIN_ROWS - 1, f"paddle.{dtype}", 64) == "stream"


def test_strided_and_batched_x() -> None:
    x, w, b, _ = _case(6, 80, 48, "bfloat16", seed=9)
    strided = x[:, ::2]  # [6, 40], not contiguous
    assert not strided.is_contiguous()
    w40 = w[:40].contiguous()
    np.testing.assert_allclose(_dense(strided, w40, b, kernel="stream").numpy(),
                               reference_linear(strided, w40, b).numpy(), rtol=1e-5, atol=1e-5)
    x3 = x.reshape([2, 3, 80])
    got = _dense(x3, w, None, kernel="stream")
    assert got.shape == [2, 3, 48]
    np.testing.assert_allclose(got.numpy(), reference_linear(x3, w).numpy(), rtol=1e-5, atol=1e-5)


def test_declines_what_it_does_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, b, _ = _case(2, 40, 32, "bfloat16", seed=1)
    assert dense16_linear(x, w.astype("float64"), b) is None  # a float64 weight
    assert dense16_linear(x, w.T, b) is None  # a non-contiguous weight is not copied
    assert dense16_linear(x.astype("float64"), w, b) is None
    monkeypatch.setenv("FD_X86_DENSE16", "0")
    assert dense16_linear(x, w, b) is None


def test_bad_inputs_raise_clear_errors() -> None:
    from fd_x86.build import load_ops

    x, w, _, _ = _case(2, 40, 32, "bfloat16", seed=1)
    with pytest.raises(ValueError, match=r"has 40 input features, the weight \[41, 32\] expects 41"):
        dense16_linear(x, paddle.zeros([41, 32], dtype="bfloat16"))
    with pytest.raises(ValueError, match="kernel must be one of"):
        dense16_linear(x, w, kernel="amx")
    ops = load_ops()
    with pytest.raises(Exception, match="w must be bfloat16, float16 or float32"):
        ops.fd_x86_dense16_linear(x, paddle.zeros([40, 32], dtype="int8"), 1, 0)
    with pytest.raises(Exception, match=r"x has K = 40 input features, w \[K, N\] has 39"):
        ops.fd_x86_dense16_linear(x, paddle.zeros([39, 32], dtype="bfloat16"), 1, 0)
    with pytest.raises(Exception, match="kernel 2 .bf16 GEMM. needs bfloat16 weights"):
        ops.fd_x86_dense16_linear(x, w.astype("float16"), 1, 2)
    with pytest.raises(Exception, match="kernel 2 .bf16 GEMM. needs bfloat16 weights"):
        ops.fd_x86_dense16_linear(x, w.astype("float32"), 1, 2)
    with pytest.raises(Exception, match=r"kernel must be 0 \(auto\), 1 \(stream\), 2 \(bf16 GEMM\) or 4 \(panel\), got 3"):
        ops.fd_x86_dense16_linear(x, w, 1, 3)
    # the run's linear op: method 11 (an fp32 weight read in place) names the dtype it takes
    with pytest.raises(Exception, match="method 11 takes a float32 weight"):
        ops.fd_x86_packed_linear(x, w, paddle.zeros([1], dtype="float32"), 11, 32, -1, 1)


def test_backend_hook_answers_16_bit_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_x86 import backend

    x, w, b, _ = _case(3, 72, 40, "bfloat16", seed=4)
    got = backend.fd_linear(x, w, b, None)
    assert got is not None
    np.testing.assert_array_equal(got.numpy(), _dense(x, w, b).numpy())
    assert backend.fd_linear(x, w.astype("float64"), b, None) is None  # float64: the reference's matmul
    monkeypatch.setenv("FD_X86_DENSE16", "0")
    assert backend.fd_linear(x, w, b, None) is None


def test_fp32_weights_take_the_native_kernels_at_every_row_count() -> None:
    """An fp32 weight (``--dtype float32``): read in place, no widening, at every row count: the stream
    kernel at decode rows, the panel kernel from PANEL_MIN_ROWS (prefills too); the reference's fp32
    products, fp32 summation order only. The backend hook answers the same."""
    from fd_x86 import backend

    for rows in (1, 3, PANEL_MIN_ROWS, 17, 65, 200):
        x, w, b, _ = _case(rows, 136, 50, "bfloat16", seed=rows)
        w32, b32 = w.astype("float32"), b.astype("float32").numpy().astype(np.float64)
        want = x.numpy().astype(np.float64) @ w32.numpy().astype(np.float64) + b32
        size = np.abs(x.numpy()) @ np.abs(w32.numpy()) + np.abs(b32)
        got = dense16_linear(x, w32, b)
        assert got is not None and np.all(np.abs(got.numpy() - want) <= 1e-6 * size + 1e-30)
        np.testing.assert_array_equal(backend.fd_linear(x, w32, b, None).numpy(), got.numpy())
