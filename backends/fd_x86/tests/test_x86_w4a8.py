"""fd_x86's native ``w4a8`` linear (int4 words, per-token int8 activations on VNNI)
against fd-core's reference (``fd_core.quantization.w4a8``), at decode and prefill
row counts, with group scales and per channel; and through the backend's ``fd_linear``."""

from __future__ import annotations

import numpy as np
import pytest
from fd_x86.cpu import AVX512_VNNI_FLAGS, cpu_features

paddle = pytest.importorskip("paddle")

from fd_core.quantization import quantize_weight  # noqa: E402
from fd_core.quantization.w4a8 import w4a8_linear as reference  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_features().has(*AVX512_VNNI_FLAGS), reason="no AVX-512 VNNI on this CPU")


@pytest.mark.parametrize("rows", [1, 3, 8, 33, 64])
@pytest.mark.parametrize("d_in, d_out, group", [(256, 48, 128), (1024, 300, 128), (96, 17, -1), (512, 64, 64)])
def test_matches_the_reference(rows: int, d_in: int, d_out: int, group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_x86.linear import w4a8_linear

    monkeypatch.delenv("FD_X86_REPACK", raising=False)
    rng = np.random.default_rng(rows * 31 + d_in + d_out)
    quant = quantize_weight("w4a8", rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05, group)
    x = rng.standard_normal((rows, d_in)).astype(np.float32)
    x[0] *= 0  # a zero token: scale 1, output 0
    got = w4a8_linear(paddle.to_tensor(x), quant)
    assert got is not None
    want = reference(paddle.to_tensor(x), quant).numpy()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    assert not got.numpy()[0].any()


def test_the_backend_answers_w4a8_linears_and_declines_without_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_x86 import backend

    rng = np.random.default_rng(3)
    quant = quantize_weight("w4a8", rng.standard_normal((256, 32)).astype(np.float32), 128)
    x = paddle.to_tensor(rng.standard_normal((2, 256)).astype(np.float32))
    bias = paddle.to_tensor(np.ones(32, np.float32))
    want = reference(x, quant).numpy() + 1
    got = backend.fd_linear(x, None, bias, quant)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-4)
    monkeypatch.setenv("FD_X86_REPACK", "0")
    assert backend.fd_linear(x, None, bias, quant) is None  # the reference answers
