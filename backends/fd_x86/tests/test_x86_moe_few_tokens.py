"""A decode step's few tokens through the MoE ops: up to 16 tokens run the
routed and shared experts in one parallel region, each thread on a slice of
every linear's channels (``moe_few_tokens`` in csrc/x86_moe_op.cc). The
result must be the per-expert loop's bit for bit: that loop still answers
calls of more tokens, where each row is computed alone, so a few tokens must
equal their rows of a 20-token call."""

from __future__ import annotations

import numpy as np
import pytest
from fd_x86 import backend, build

paddle = pytest.importorskip("paddle")

from fd_core.quantization.weights import quantize_array  # noqa: E402

_CODE = {"wint8": 0, "wint4": 1, "w8a8": 2}


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    build.load_ops()


def _weights(method: str, rng: np.random.Generator, experts: int, d_in: int, d_out: int,
             group: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Stacked (experts > 0) or 2-D (experts == 0) contract-layout qweight, scales and group of ``method``."""
    parts = [quantize_array(method, rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05, group)
             for _ in range(max(1, experts))]
    if experts == 0:
        return parts[0][0], parts[0][1], parts[0][2]
    return np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]), parts[0][2]


def _group(g: int) -> int:
    return g if g and g > 0 else -1


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("method, shared_method, group", [
    ("wint8", "wint8", 128), ("wint4", "wint8", 128), ("wint4", "wint4", 64), ("w8a8", "w8a8", 128),
    ("wint4", None, 128),
])
def test_few_tokens_equal_their_rows_of_a_larger_call(method: str, shared_method: str | None, group: int,
                                                      threads: int) -> None:
    _check_few_tokens(method, shared_method, group, threads, (256, 96, 160))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("method, shared_method", [
    ("wint8", "wint8"), ("wint4", "wint8"), ("wint4", "wint4"), ("wint8", None), ("w8a8", "wint8"),
])
def test_widths_not_multiples_of_32_split_unevenly_and_still_agree(method: str, shared_method: str | None,
                                                                   threads: int) -> None:
    """Widths multiples of 4 but not of 32: the threads' 32-channel slices are uneven and the
    last tiles are 4 wide (per-channel scales, as groups of 128 do not divide them)."""
    _check_few_tokens(method, shared_method, -1, threads, (260, 100, 36))


def _check_few_tokens(method: str, shared_method: str | None, group: int, threads: int,
                      widths: tuple[int, int, int]) -> None:
    ops = build.load_ops()
    rng = np.random.default_rng(threads * 7 + len(method))
    experts, k = 8, 3
    d, inter, inter_s = widths
    up = _weights(method, rng, experts, d, 2 * inter, group)
    down = _weights(method, rng, experts, inter, d, group)
    tokens = 20  # more than the few-token path takes: the per-expert loop
    x2 = rng.standard_normal((tokens, d)).astype(np.float32)
    ids2 = np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]).astype(np.int64)
    w2 = rng.random((tokens, k)).astype(np.float32)

    def call(x: np.ndarray, ids: np.ndarray, w: np.ndarray) -> np.ndarray:
        args = [paddle.to_tensor(a) for a in (x, ids, w, up[0], up[1], down[0], down[1])]
        if shared_method is None:
            return ops.fd_x86_moe_experts(*args, _CODE[method], _group(up[2]), _group(down[2]), 0, threads).numpy()
        s_up = _weights(shared_method, np.random.default_rng(5), 0, d, 2 * inter_s, group)
        s_down = _weights(shared_method, np.random.default_rng(6), 0, inter_s, d, group)
        shared = [paddle.to_tensor(a) for a in (s_up[0], s_up[1], s_down[0], s_down[1])]
        return ops.fd_x86_moe_experts_shared(
            *args, *shared, _CODE[method], _group(up[2]), _group(down[2]), _CODE[shared_method], _group(s_up[2]),
            _group(s_down[2]), 0, threads).numpy()

    both = call(x2, ids2, w2)
    for first, count in ((0, 1), (5, 1), (0, 3), (4, 8), (2, 16)):  # a batch of 16: experts with many rows
        rows = slice(first, first + count)
        np.testing.assert_array_equal(call(x2[rows], ids2[rows], w2[rows]), both[rows])

