"""What the bf16-activation kernel tests share (``test_x86_int4_bf16.py``, ``test_x86_int8_bf16.py``):
bf16 rounding, and one quantized decoder layer run by the fused run against the layer composed op by
op, with the kernel codes the run chose."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from fd_core.layers.param import _fp32_to_bf16


def bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bf16 (nearest even) as fp32."""
    return (_fp32_to_bf16(x).astype(np.uint32) << 16).view(np.float32)


def decoder_layer(method: str, act_dtype: str, group: int | None = None) -> Any:
    """A small decoder layer with every linear quantized by ``method`` (group ``group``), its
    model's activations ``act_dtype``."""
    import paddle

    from fd_core.ops.decoder import DecoderLayerWeights
    from fd_core.quantization import quantize_weight

    hidden, inter, heads, kv_heads, head_dim = 128, 256, 2, 1, 64
    rng = np.random.default_rng(zlib.crc32(act_dtype.encode()))

    def weight(d_in: int, d_out: int) -> Any:
        w = (rng.normal(0, 1, (d_in, d_out)) / np.sqrt(d_in)).astype(np.float32)
        q = quantize_weight(method, w, group) if group is not None else quantize_weight(method, w)
        q.act_dtype = act_dtype
        return q

    return DecoderLayerWeights(
        input_norm=paddle.to_tensor(rng.normal(1, 0.1, hidden).astype(np.float32)),
        post_norm=paddle.to_tensor(rng.normal(1, 0.1, hidden).astype(np.float32)), eps=1e-6,
        qkv=weight(hidden, (heads + 2 * kv_heads) * head_dim), o=weight(heads * head_dim, hidden),
        up_gate=weight(hidden, 2 * inter), down=weight(inter, hidden),
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, scale=head_dim**-0.5, interleaved_rope=True)


class FusedCase:
    """Three decode rows through ``layer``: ``run(compose)`` gives (hidden, residual, k, v) from the
    fused run (False) or op by op (True); ``methods()`` lists the kernel codes of this case's runs
    (the run cache is per model, keyed by the rotary table)."""

    def __init__(self, x86_ops: Any, layer: Any) -> None:
        from fd_core.ops.rope import rope_cos_sin

        rng = np.random.default_rng(7)
        self.x86_ops, self.layer = x86_ops, layer
        self.cos_sin = rope_cos_sin(64, 256, 10000.0)
        self.k0 = rng.normal(0, 1, (12 * 16, 1, 64)).astype(np.float32)
        self.v0 = rng.normal(0, 1, (12 * 16, 1, 64)).astype(np.float32)
        self.hidden = rng.normal(0, 1, (3, 128)).astype(np.float32)

    def run(self, compose: bool) -> tuple[np.ndarray, ...]:
        import fd_x86.layer as fused
        import paddle

        from fd_core.ops.attention import AttentionMetadata
        from fd_core.ops.decoder import compose_decoder_layer

        meta = AttentionMetadata.build([1] * 3, [40, 17, 33], [[0, 1, 2], [3, 4], [5, 6, 7]], 16, 3)
        k, v = paddle.to_tensor(self.k0.copy()), paddle.to_tensor(self.v0.copy())
        hidden = paddle.to_tensor(self.hidden)
        if compose:
            out = compose_decoder_layer(self.x86_ops, self.layer, hidden, None, self.cos_sin, meta, k, v)
        else:
            out = fused.decoder_layers([self.layer], hidden, None, self.cos_sin, meta, [k], [v])
            assert out is not None
        return out[0].numpy(), out[1].numpy(), k.numpy(), v.numpy()

    def methods(self) -> list[Any]:
        import fd_x86.layer as fused

        return [entry[1][6] for entry in fused._MODELS[id(self.cos_sin)][1].runs.values() if entry[1] is not None]

    def check(self, method: int, switch: str, off_method: int, monkeypatch: Any) -> None:
        """The fused run takes ``method`` for all four linears and equals the composed layer; with
        ``switch=0`` (part of the run's key) a new run takes ``off_method``."""
        got, want = self.run(False), self.run(True)
        assert [method] * 4 in self.methods()
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)
        monkeypatch.setenv(switch, "0")
        self.run(False)
        assert [off_method] * 4 in self.methods()
