"""ERNIE-4.5-VL's vision tower and resampler reach their kernels through the backend's
ops: every linear through ``fd_linear``, each block's rotary + attention through
``fd_vision_attention`` with one frame per time step (numerics: the HF oracle tests)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fd_core.backends import cpu
from fd_core.backends.base import Ops
from fd_core.models.ernie4_5_vl_config import VisionConfig
from fd_core.models.ernie4_5_vl_vision import Resampler, VisionTower
from fd_core.plugins import hookimpl
from fd_core.plugins.manager import make_plugin_manager

paddle = pytest.importorskip("paddle")


class Spy:
    """A backend that notes the kernel calls it is asked for and declines them (the reference answers)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    @hookimpl
    def fd_linear(self, x: Any, weight: Any, bias: Any, quant: Any) -> Any:
        self.calls.append(("linear", tuple(weight.shape), bias is not None))
        return None

    @hookimpl
    def fd_vision_attention(self, qkv: Any, cos: Any, sin: Any, cu_seqlens: list[int], num_heads: int,
                            scale: float) -> Any:
        self.calls.append(("vision_attention", tuple(qkv.shape), tuple(cos.shape), list(cu_seqlens), num_heads,
                           scale))
        return None


def _filled(params: dict[str, Any], rng: np.random.Generator) -> None:
    for param in params.values():
        param.set(paddle.to_tensor(rng.normal(0, 0.1, param.shape).astype(np.float32)))


def test_tower_and_resampler_call_the_backend_ops() -> None:
    spy = Spy()
    ops = Ops(make_plugin_manager(cpu, spy), "spy")
    c = VisionConfig(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=2)
    tower, resampler = VisionTower(c, ops), Resampler(c, 16, 1e-6, ops)
    rng = np.random.default_rng(0)
    _filled(tower.params(""), rng)
    _filled(resampler.params(""), rng)
    grid = (2, 4, 6)  # two frames of 4x6 patches
    n = 2 * 4 * 6
    feats = tower(paddle.to_tensor(rng.normal(0, 1, (n, 3 * 2 * 2)).astype(np.float32)), grid)
    out = resampler(feats, grid)
    assert feats.shape == [n, 32] and out.shape == [n // 4 // 2, 16]
    attention = [call for call in spy.calls if call[0] == "vision_attention"]
    assert attention == [("vision_attention", (n, 96), (n, 8), [0, 24, 48], 2, 16**-0.5)] * 2  # one per block
    linears = [call[1:] for call in spy.calls if call[0] == "linear"]
    block = [((32, 96), True), ((32, 32), True), ((32, 48), True), ((48, 32), True)]  # qkv, proj, fc1, fc2
    merge = [((128, 128), True), ((128, 128), True), ((256, 128), True), ((128, 128), True), ((128, 16), True)]
    assert linears == [((12, 32), False)] + block * 2 + merge  # patch embed, blocks, resampler
