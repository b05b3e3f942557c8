"""fd-x86 as a backend: listing, selection, the fd_linear hook and its fallbacks."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from fd_x86 import backend, build
from fd_x86.cpu import CpuFeatures, choose_kernels
from x86_contract import linear, quantize, to_paddle

paddle = pytest.importorskip("paddle")


@pytest.fixture(scope="module")
def x86():
    from fd_core.backends import get_backend

    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    return get_backend("x86")


def test_listing_shows_x86_usable_with_its_kernels() -> None:
    from fd_core.backends import format_listing, list_backends

    rows = {row.name: row for row in list_backends()}
    row = rows["x86"]
    assert row.info.device_type == "cpu" and row.info.collective_backend == "gloo"
    assert row.info.auto_priority > rows["cpu"].info.auto_priority
    choice = choose_kernels()
    if choice.isa is None:
        assert not row.availability.usable and "AVX2" in row.availability.reason
        return
    assert row.availability.usable, row.availability.reason
    notes = "; ".join(row.availability.details)
    assert (f"w8a8: {choice.isa}" in notes or "w8a8: AMX-int8" in notes) and "AMX" in notes
    assert "x86" in format_listing(list(rows.values()))


def test_auto_prefers_x86_over_the_reference(x86) -> None:
    from fd_core.backends import get_backend

    assert get_backend("auto").name != "cpu"


def test_kernel_choice_follows_cpu_flags() -> None:
    avx512 = CpuFeatures("test", frozenset("avx2 fma avx512f avx512bw avx512vl avx512dq avx512_vnni".split()))
    assert choose_kernels(avx512).isa == "avx512"
    assert "no AMX on this CPU" in choose_kernels(avx512).summary[0]
    amx = CpuFeatures("test", avx512.flags | {"amx_tile", "amx_int8"})
    assert choose_kernels(amx).isa == "avx512"
    avx2 = CpuFeatures("test", frozenset({"avx2", "fma", "avx512f"}))
    assert choose_kernels(avx2).isa == "avx2" and "avx512_vnni" in choose_kernels(avx2).summary[0]
    old = choose_kernels(CpuFeatures("Old CPU", frozenset({"sse4_2", "avx"})))
    assert old.isa is None and "Old CPU" in old.reason and "--backend cpu" in old.reason


def test_unusable_without_compiler_when_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "is_built", lambda: False)
    monkeypatch.setattr(build, "compiler", lambda: None)
    availability = backend.fd_device_availability()
    assert not availability.usable and "compiler" in availability.reason


def test_availability_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(build, "is_built", boom)
    availability = backend.fd_device_availability()
    assert not availability.usable and "disk on fire" in availability.reason


@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
def test_linear_hook_runs_the_native_op(x86, method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import fd_x86.linear

    calls = []
    real = fd_x86.linear.quantized_linear
    monkeypatch.setattr(fd_x86.linear, "quantized_linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (5, 256)).astype(np.float32)
    b = rng.normal(0, 1, 48).astype(np.float32)
    q = quantize(method, rng.normal(0, 0.06, (256, 48)).astype(np.float32))
    got = x86.ops.linear(paddle.to_tensor(x), None, paddle.to_tensor(b), to_paddle(q)).numpy()
    np.testing.assert_allclose(got, linear(x, q) + b, rtol=1e-4, atol=1e-4)
    assert calls, "the x86 kernel did not answer"


def test_unquantized_linear_falls_back_to_the_reference(x86) -> None:
    rng = np.random.default_rng(1)
    x, w = rng.normal(0, 1, (3, 64)).astype(np.float32), rng.normal(0, 1, (64, 16)).astype(np.float32)
    w64 = paddle.to_tensor(w.astype(np.float64))  # a dtype fd_x86 has no kernel for
    assert backend.fd_linear(x=paddle.to_tensor(x), weight=w64, bias=None, quant=None) is None
    got = x86.ops.linear(paddle.to_tensor(x), paddle.to_tensor(w)).numpy()
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-5)


def test_build_failure_is_logged_once_and_falls_back(
    x86, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import fd_x86.linear

    def fail() -> None:
        raise build.BuildError("no compiler here")

    monkeypatch.setattr(fd_x86.linear, "load_ops", fail)
    monkeypatch.setattr(backend, "_build_failed", [])
    q = to_paddle(quantize("wint8", np.ones((64, 8), np.float32)))
    with caplog.at_level(logging.WARNING, logger="fd_x86.backend"):
        for _ in range(2):
            assert backend.fd_linear(x=paddle.ones([2, 64]), weight=None, bias=None, quant=q) is None
    assert [r.message for r in caplog.records].count(
        "fd_x86: no compiler here; quantized linears fall back to fd-core's reference") == 1
