"""The native draw (``fd_sample`` on x86: ``csrc/x86_sample_op.cc``) against the reference's host draw
(``fd_core.ops.sampling._host_sample``, float64 numpy): the same token for every row of random logits, flat
and peaked, with ties, -inf, NaN and +inf, at vocabulary widths around the kernel's 8-lane steps, under every
filter and their edges; rows independent of their batch; what the op declines and refuses. Each test runs
with the AVX-512 kernels and with the plain loops of CPUs without AVX-512."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from fd_core.ops.sampling import _host_sample  # noqa: E402


@pytest.fixture(autouse=True, params=["avx512", "portable"])
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: the AVX-512 kernels where the CPU has them, and the plain loops a CPU without AVX-512
    runs (``FD_X86_SAMPLE_ISA=portable``)."""
    if request.param == "portable":
        monkeypatch.setenv("FD_X86_SAMPLE_ISA", "portable")
    else:
        monkeypatch.delenv("FD_X86_SAMPLE_ISA", raising=False)
    return str(request.param)

# (temperature, top_k, top_p, min_p)
SETTINGS = [
    (1.0, 0, 0.9, 0.0), (0.8, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 50, 1.0, 0.0), (1.3, 20, 0.8, 0.0),
    (0.9, 0, 1.0, 0.05), (1.0, 1, 1.0, 0.0), (1.1, 1000, 0.95, 0.02), (0.5, 0, 0.3, 0.0), (2.0, 5, 1.0, 0.0),
    (0.8, 0, 0.999, 0.0), (1.0, 200_000, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (0.0, 7, 0.5, 0.3), (1.0, 0, 1e-6, 0.0),
    (1.0, 0, 1.0, 1.0), (1e-3, 0, 1.0, 0.0), (60.0, 3, 1.0, 0.0),
]


def _columns(settings: list[tuple[float, int, float, float]]) -> list[np.ndarray]:
    t, k, p, m = zip(*settings)
    return [np.array(t, np.float32), np.array(k, np.int64), np.array(p, np.float32), np.array(m, np.float32)]


def _native(x86_ops: Any, logits: np.ndarray, cols: list[np.ndarray], uniforms: np.ndarray) -> np.ndarray:
    out = x86_ops.sample(paddle.to_tensor(logits), *(paddle.to_tensor(c) for c in cols), paddle.to_tensor(uniforms),
                         "sort")
    assert str(out.dtype) == "paddle.int64" and list(out.shape) == [logits.shape[0]]
    return out.numpy()


@pytest.mark.parametrize("vocab", [1, 7, 8, 9, 100, 1003, 32003, 103424])
@pytest.mark.parametrize("form", ["flat", "peaked", "ties", "wide"])
def test_every_row_draws_the_references_token(x86_ops: Any, vocab: int, form: str) -> None:
    """Each setting on 3 rows of logits (normal with std 1 or 20, or rounded to integers: many equal weights),
    fresh uniforms per row; the reference's float64 sort draw gives the same token."""
    rng = np.random.default_rng([vocab, len(form)])
    settings = SETTINGS * 3
    scale = {"flat": 1.0, "peaked": 20.0, "ties": 3.0, "wide": 200.0}[form]
    logits = (rng.standard_normal((len(settings), vocab)) * scale).astype(np.float32)
    if form == "ties":
        logits = np.round(logits).astype(np.float32)
    cols, uniforms = _columns(settings), rng.random((len(settings), 16), dtype=np.float32)
    want = _host_sample(logits, *cols, uniforms, "sort")
    np.testing.assert_array_equal(_native(x86_ops, logits, cols, uniforms), want)


def test_minus_inf_nan_and_plus_inf_rows(x86_ops: Any) -> None:
    """-inf columns are never drawn; a row with a NaN or +inf, or all -inf, has no finite maximum and takes
    the argmax (the first NaN, the first +inf, column 0), as the reference."""
    rng = np.random.default_rng(5)
    vocab = 1000
    logits = rng.standard_normal((6, vocab)).astype(np.float32)
    logits[0, ::2] = -np.inf
    logits[1, 17], logits[1, 300] = np.nan, np.nan
    logits[2, 40], logits[2, 41] = np.inf, np.inf
    logits[3] = -np.inf
    logits[4, 999] = np.nan
    logits[5, :-1] = -np.inf  # one finite column
    cols = _columns([(1.0, 0, 0.9, 0.0)] * 6)
    uniforms = rng.random((6, 16), dtype=np.float32)
    got = _native(x86_ops, logits, cols, uniforms)
    np.testing.assert_array_equal(got, _host_sample(logits, *cols, uniforms, "sort"))
    assert got[0] % 2 == 1 and list(got[1:]) == [17, 40, 0, 999, 999]


def test_min_p_nan_is_off_and_min_p_above_one_takes_the_argmax(x86_ops: Any) -> None:
    """Out of the engine's range (it validates min_p in [0, 1]), the op still answers: a NaN min_p filters
    nothing, as the reference (which filters only for min_p > 0); a min_p above 1, which drops every weight,
    gives the argmax instead of reading past the buckets."""
    rng = np.random.default_rng(9)
    logits = rng.standard_normal((2, 5000)).astype(np.float32)
    uniforms = rng.random((2, 16), dtype=np.float32)
    nan = _columns([(1.0, 0, 0.9, float("nan"))] * 2)
    np.testing.assert_array_equal(_native(x86_ops, logits, nan, uniforms), _host_sample(logits, *nan, uniforms, "sort"))
    above = _columns([(1.0, 0, 0.9, 1.5)] * 2)
    np.testing.assert_array_equal(_native(x86_ops, logits, above, uniforms), logits.argmax(axis=-1))


def test_uniforms_at_the_edges_and_rows_independent_of_the_batch(x86_ops: Any) -> None:
    """u = 0 takes the most likely token, u just under 1 the last of the kept set; a row's token is the same
    alone and at any row of a batch (threads split the rows)."""
    rng = np.random.default_rng(6)
    vocab = 5000
    logits = (rng.standard_normal((16, vocab)) * 2).astype(np.float32)
    settings = (SETTINGS * 2)[:16]
    cols = _columns(settings)
    uniforms = rng.random((16, 16), dtype=np.float32)
    uniforms[:4, 0] = 0.0
    uniforms[4:8, 0] = np.float32(1 - 2**-24)
    together = _native(x86_ops, logits, cols, uniforms)
    np.testing.assert_array_equal(together, _host_sample(logits, *cols, uniforms, "sort"))
    for i in range(16):
        alone = _native(x86_ops, logits[i:i + 1], [c[i:i + 1] for c in cols], uniforms[i:i + 1])
        assert alone[0] == together[i], i


def test_what_the_native_draw_declines_and_refuses(x86_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "rejection" method, fp64 logits and FD_X86_SAMPLE=0 go to the reference (which then answers);
    arguments of the wrong size are refused by name."""
    from fd_x86.sampling import sample

    rng = np.random.default_rng(7)
    logits = paddle.to_tensor(rng.standard_normal((2, 50)).astype(np.float32))
    cols = [paddle.to_tensor(c) for c in _columns([(1.0, 0, 0.9, 0.0)] * 2)]
    uniforms = paddle.to_tensor(rng.random((2, 16), dtype=np.float32))
    assert sample(logits, *cols, uniforms, "sort") is not None
    assert sample(logits, *cols, uniforms, "rejection") is None
    assert sample(logits.astype("float64"), *cols, uniforms, "sort") is None
    monkeypatch.setenv("FD_X86_SAMPLE", "0")
    assert sample(logits, *cols, uniforms, "sort") is None
    assert x86_ops.sample(logits, *cols, uniforms, "sort").shape == [2]  # the reference answered
    monkeypatch.delenv("FD_X86_SAMPLE")
    with pytest.raises(Exception, match="fd_x86_sample: top_p must be a contiguous host tensor of 2 fp32 values"):
        sample(logits, cols[0], cols[1], paddle.to_tensor(np.ones(3, np.float32)), cols[3], uniforms, "sort")
    with pytest.raises(Exception, match=r"fd_x86_sample: uniforms must be a contiguous \[B, R >= 1\]"):
        sample(logits, *cols, paddle.to_tensor(np.zeros((3, 16), np.float32)), "sort")


def test_the_sampler_takes_the_native_draw(x86_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Sampler`` on the x86 backend: seeded requests draw the reference's tokens through the native op."""
    from fd_x86 import build

    from fd_core.backends import get_backend
    from fd_core.sampling.params import SamplingParams
    from fd_core.sampling.sampler import Sampler, SamplingState

    rng = np.random.default_rng(8)
    logits = paddle.to_tensor((rng.standard_normal((4, 3000)) * 3).astype(np.float32))
    params = [SamplingParams(temperature=0.8, top_p=0.8, seed=1), SamplingParams(temperature=0),
              SamplingParams(temperature=1.0, top_k=10, seed=2), SamplingParams(temperature=1.2, min_p=0.1, seed=3)]
    calls: list[int] = []
    real = build.load_ops().fd_x86_sample
    monkeypatch.setattr(build.load_ops(), "fd_x86_sample", lambda *a: calls.append(1) or real(*a))
    got = Sampler(x86_ops, 3000).sample(logits, [SamplingState.create(p) for p in params]).sampled_token_ids
    want = Sampler(get_backend("cpu").ops, 3000).sample(logits, [SamplingState.create(p) for p in params])
    assert calls and got == want.sampled_token_ids
