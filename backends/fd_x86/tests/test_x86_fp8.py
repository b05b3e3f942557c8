"""The block-wise fp8 op (fd_x86.fp8), both kernels (fp32 FMA; vdpbf16ps
where the CPU has AVX-512 BF16 + VBMI), against fd-core's reference
numerics, on odd shapes (tails in K, N and the 128-blocks; row counts that
split into several tiles and row blocks), subnormal and extreme weights and
activations, and through the backend's fd_linear."""

from __future__ import annotations

import numpy as np
import pytest
from fd_x86.cpu import AVX512_FLAGS, cpu_features

paddle = pytest.importorskip("paddle")

from fd_core.quantization import quantize_weight  # noqa: E402
from fd_core.quantization.block_fp8 import block_fp8_linear as reference  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_features().has(*AVX512_FLAGS), reason="no AVX-512 on this CPU")
ROWS = (1, 2, 3, 5, 8, 37, 64)
SHAPES = [(128, 128), (200, 130), (1024, 300), (64, 7), (300, 1000), (3072, 36)]  # (in, out)
HAS_BF16 = cpu_features().has("avx512_bf16", "avx512vbmi")
KERNELS = ["fma", pytest.param("bf16", marks=pytest.mark.skipif(not HAS_BF16, reason="no AVX-512 BF16 + VBMI"))]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    # fp32 sums in another order: error relative to the row's largest outputs
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("d_in,d_out", SHAPES)
def test_matches_the_reference(rows, d_in, d_out, kernel):
    from fd_x86.fp8 import block_fp8_linear

    rng = np.random.default_rng(rows * 7919 + d_in + d_out)
    x = rng.normal(0, 1, (rows, d_in)).astype(np.float32)
    x[0, : min(128, d_in)] *= 300.0  # one group far larger
    if rows >= 3:
        x[1] = 0.0
        x[2, ::3] = 1e-30  # tiny activations: scales at the 1e-10 floor, subnormal e4m3 codes
    w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
    w[:, 0] = 0.0
    w[: min(128, d_in), -1] *= 1e-3  # small against its block: subnormal e4m3 weights
    q = quantize_weight("block_wise_fp8", w)
    xt = paddle.to_tensor(x)
    got = block_fp8_linear(xt, q, threads=2, kernel=kernel).numpy()
    want = reference(xt, q).numpy()
    _close(got, want)
    if rows >= 3:
        np.testing.assert_array_equal(got[1], 0.0)
    np.testing.assert_array_equal(block_fp8_linear(xt, q, threads=1, kernel=kernel).numpy(), got)  # no race


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_code_decodes(kernel):
    """All 254 finite e4m3 codes (subnormals and +-448 included) through the op."""
    from fd_x86.fp8 import block_fp8_linear

    from fd_core.ops.linear import QuantizedWeight

    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)  # 254
    qweight = np.zeros((254, 256), dtype=np.uint8)
    qweight[np.arange(254), np.arange(254)] = codes  # output o reads input o's code
    quant = QuantizedWeight("block_wise_fp8", paddle.to_tensor(qweight), paddle.ones([2, 2]), 256, 254, -1)
    x = np.zeros((1, 256), dtype=np.float32)
    x[0, :128], x[0, 128:] = 448.0, 448.0  # activation codes 448, scales exactly 1
    got = block_fp8_linear(paddle.to_tensor(x), quant, threads=1, kernel=kernel).numpy()[0]
    want = reference(paddle.to_tensor(x), quant).numpy()[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_activation_code_against_every_weight_code(kernel):
    """Products of all finite e4m3 pairs, one per output: activation code a
    (its group's scale exactly 1: the group holds 448) times weight code w,
    exact in fp32, so the op equals the table product bit for bit."""
    from fd_x86.fp8 import block_fp8_linear

    from fd_core.ops.linear import QuantizedWeight
    from fd_core.quantization.block_fp8 import E4M3_VALUES

    finite = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
    x = np.zeros((len(finite), 256), dtype=np.float32)
    x[:, 128] = 448.0  # second group: scale 1; the first group holds the code under test and 448
    x[:, 0] = 448.0
    x[:, 1] = E4M3_VALUES[finite]
    qweight = np.zeros((254, 256), dtype=np.uint8)
    qweight[:, 1] = finite  # output o multiplies input 1 by weight code o
    quant = QuantizedWeight("block_wise_fp8", paddle.to_tensor(qweight), paddle.ones([2, 2]), 256, 254, -1)
    got = block_fp8_linear(paddle.to_tensor(x), quant, threads=2, kernel=kernel).numpy()
    want = np.outer(E4M3_VALUES[finite], E4M3_VALUES[finite])  # [activation, weight]
    np.testing.assert_array_equal(got, want)


def test_auto_runs_the_selected_kernel_and_bad_names_are_refused():
    from fd_x86.fp8 import block_fp8_linear, selected_kernel

    assert selected_kernel() == ("bf16" if HAS_BF16 else "fma")
    rng = np.random.default_rng(3)
    x = paddle.to_tensor(rng.normal(0, 1, (5, 300)).astype(np.float32))
    q = quantize_weight("block_wise_fp8", rng.normal(0, 0.05, (300, 70)).astype(np.float32))
    np.testing.assert_array_equal(block_fp8_linear(x, q, 2).numpy(),
                                  block_fp8_linear(x, q, 2, kernel=selected_kernel()).numpy())
    with pytest.raises(ValueError, match="kernel must be one of"):
        block_fp8_linear(x, q, 2, kernel="amx")


def test_backend_answers_fp8_and_w4a8_linears(cpu_backend_x86, monkeypatch):
    ops = cpu_backend_x86.ops
    rng = np.random.default_rng(1)
    x = paddle.to_tensor(rng.normal(0, 1, (4, 256)).astype(np.float32))
    w = rng.normal(0, 1 / 16, (256, 96)).astype(np.float32)
    bias = paddle.to_tensor(rng.normal(0, 1, 96).astype(np.float32))
    q = quantize_weight("block_wise_fp8", w)
    _close(ops.linear(x, None, bias, q).numpy(), (reference(x, q) + bias).numpy())
    w4a8 = quantize_weight("w4a8", w)  # its own native kernel (test_x86_w4a8.py): the reference's numbers
    import fd_x86.linear

    from fd_core.quantization.w4a8 import w4a8_linear

    native, answered = fd_x86.linear.w4a8_linear, []
    monkeypatch.setattr(fd_x86.linear, "w4a8_linear", lambda *a, **k: answered.append(1) or native(*a, **k))
    want = w4a8_linear(x, w4a8).numpy()
    np.testing.assert_allclose(ops.linear(x, None, None, w4a8).numpy(), want, rtol=1e-5,
                               atol=1e-5 * float(np.abs(want).max()))
    assert answered  # the native kernel, not the reference


@pytest.fixture(scope="module")
def cpu_backend_x86():
    from fd_core.backends import get_backend

    backend = get_backend("x86")
    backend.set_device(0)
    return backend


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
def test_models_run_fp8_on_x86_like_the_reference(tmp_path, monkeypatch, shape):
    """The x86 backend lists block_wise_fp8 and w4a8: its fp8 linears are native
    (each call checked against the reference inside the model run; routed experts
    take the same kernel per expert, test_x86_moe.py), w4a8's linears run natively
    (test_x86_w4a8.py) and so do its experts where the widths allow (test_x86_w4a8_moe.py); greedy
    tokens equal the CPU
    reference's."""
    import fd_x86.fp8

    from fd_core.backends.registry import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.quantization.config import parse_quantization
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.testing.greedy import greedy_generate

    native, calls = fd_x86.fp8.block_fp8_linear, []

    def checked(x, quant, threads=None):
        out = native(x, quant, threads)
        want = reference(x.reshape([-1, quant.in_features]), quant).numpy()
        _close(out.numpy().reshape(want.shape), want)
        calls.append(int(want.shape[0]))
        return out

    monkeypatch.setattr(fd_x86.fp8, "block_fp8_linear", checked)
    model = generate_checkpoint(tmp_path / shape, shape, naming="paddle", seed=7, dtype="float32")
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(100, 1000, n)] for n in (4, 21)]
    for method in ("block_wise_fp8", "w4a8"):
        results = []
        for name in ("x86", "cpu"):
            quantization = parse_quantization(method, "Ernie4_5_MoeForCausalLM")
            runner = ModelRunner(model, get_backend(name), num_blocks=24, block_size=16, quantization=quantization)
            results.append(greedy_generate(runner, prompts, 8, chunk_size=8))
        assert results[0][0] == results[1][0], method
    assert len(calls) > 8 and max(calls) > 3  # decode and prefill-sized calls both ran natively


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_fused_decoder_layers_take_fp8_like_the_composed_ops(monkeypatch, batch):
    """fd_x86.layer runs block_wise_fp8 layers in the fused decode op (the
    same kernel as the separate fp8 linears: equal to their composition)."""
    import fd_x86.layer as fused
    import test_x86_layer as layer_tests
    from fd_x86.linear import _use_packed

    from fd_core.backends import get_backend

    if not _use_packed("auto"):
        pytest.skip("no packed kernels here (AVX-512 VNNI, FD_X86_REPACK): the fused layer always declines")
    monkeypatch.delenv("FD_X86_FUSED_LAYER", raising=False)
    fused._enabled.cache_clear()
    try:
        layer = layer_tests._layer("block_wise_fp8")
        step = layer_tests._step(batch, True, seed=batch)
        got = layer_tests._run_fused(layer, step)
        want = layer_tests._run_composed(get_backend("x86").ops, layer, step)
        layer_tests._assert_same(got, want, rtol=1e-5, atol=1e-5)
    finally:
        fused._enabled.cache_clear()


def test_codes_are_copied_once_into_huge_pages_and_follow_the_weight(monkeypatch):
    from fd_x86 import memory
    from fd_x86.fp8 import resident_codes
    from fd_x86.linear import _use_packed

    rng = np.random.default_rng(4)
    q = quantize_weight("block_wise_fp8", rng.normal(0, 0.05, (256, 130)).astype(np.float32))
    codes = resident_codes(q)
    np.testing.assert_array_equal(codes.numpy(), q.qweight.numpy())
    if not (memory.enabled() and _use_packed("auto")):
        assert codes is q.qweight
        return
    assert codes is not q.qweight and resident_codes(q) is codes  # one copy, cached
    q.qweight = paddle.to_tensor(np.ascontiguousarray(q.qweight.numpy()[:, ::-1]))  # a new weight: a new copy
    again = resident_codes(q)
    assert again is not codes
    np.testing.assert_array_equal(again.numpy(), q.qweight.numpy())
    monkeypatch.setenv("FD_X86_HUGEPAGES", "0")  # copies off: the weight itself
    plain = quantize_weight("block_wise_fp8", np.ones((128, 128), np.float32))
    assert resident_codes(plain) is plain.qweight
