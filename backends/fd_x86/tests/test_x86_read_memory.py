"""fd_x86_read_memory: the benchmarks' memory-floor probe reads every whole
64-byte line of its buffer once (its xor proves each byte was loaded)."""

from __future__ import annotations

import numpy as np
import pytest
from fd_x86 import build

paddle = pytest.importorskip("paddle")

from fd_x86.dense16 import dense16_enabled  # noqa: E402


@pytest.mark.parametrize("size", [64, 64 * 7 + 5, 1 << 20])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_checksum_covers_every_aligned_line(size: int, threads: int) -> None:
    if not dense16_enabled():
        pytest.skip("the probe needs AVX-512")
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    tensor = paddle.to_tensor(data)
    got = int(build.load_ops().fd_x86_read_memory(tensor, threads).numpy()[0]) & (2**64 - 1)
    address = tensor.data_ptr()
    skip = (64 - address % 64) % 64
    lines = (size - skip) // 64
    words = data[skip:skip + lines * 64].view(np.uint64)
    want = int(np.bitwise_xor.reduce(words)) if len(words) else 0
    assert got == want


def test_it_refuses_other_dtypes() -> None:
    if not dense16_enabled():
        pytest.skip("the probe needs AVX-512")
    with pytest.raises(Exception, match="contiguous uint8"):
        build.load_ops().fd_x86_read_memory(paddle.zeros([64], dtype="float32"), 1)
