"""Offline-quantized ERNIE checkpoints in FastDeploy's on-disk layouts, for tests.

``quantize_checkpoint(src, out, fmt)`` reads a generated float Paddle-named
ERNIE checkpoint (``fd_core.testing.checkpoints``) and writes the same model
as FastDeploy's offline checkpoints store it (``OFFLINE_FORMATS.md`` in
``fd_core/quantization``; layouts in ``fd_core.quantization.prequantized``):

- ``fp8`` (ERNIE-4.5-*-FP8-Paddle): every linear layer and routed expert
  ``block_wise_fp8`` (``per_block_cast_to_fp8``'s rule: 128 x 128 blocks,
  ``amax / 448``), ``quantization_config = {"quantization": "block_wise_fp8"}``;
- ``w4a8c8`` (-W4A8C8-TP4-Paddle): dense layers wint8 (per channel,
  ``amax / 127``), experts int4 per channel with a static per-expert
  activation max, and per-channel int8 KV-cache maxima
  (``cachek_matmul`` / ``cachev_matmul.activation_scale``);
  ``{"quantization": "mix_quant", "dense_quant_type": "wint8",
  "moe_quant_type": "w4a8", "kv_cache_quant_type": "int8"}``;
- ``2bits`` (-2Bits-Paddle): dense wint8, the first MoE layer's experts wint4
  per channel, the others wint2 (``encode_wint2``), with FastDeploy's
  documented ``quantization_config`` (its layer bounds set for this model).

Static activation and KV maxima are calibrated on 256 Gaussian tokens scaled
by the layer's norm weight (the hidden state an RMSNorm hands the layer), not
on text: enough to exercise the scales, not a calibration of record.
Embeddings, norms, router gates and the LM head are copied as stored.

    python -m fd_core.testing.quantized_checkpoints SRC OUT --format fp8
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fd_core.model_loader.safetensors_io import SafetensorsFile
from fd_core.quantization.block_fp8 import quantize_block_fp8
from fd_core.quantization.wint import quantize_int4, quantize_int8
from fd_core.quantization.wint2 import encode_wint2

__all__ = ["FORMATS", "generate_offline_checkpoint", "quantize_checkpoint"]

FORMATS = ("fp8", "w4a8c8", "2bits")
_DENSE = re.compile(r"^ernie\.layers\.(\d+)\.(self_attn\.(qkv|o)_proj|mlp\.(shared_experts\.)?(up_gate|down)_proj)\.weight$")
_EXPERT = re.compile(r"^ernie\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(up_gate|down)_proj\.weight$")
_CALIB_TOKENS = 256
_KV_CALIB_TOKENS = 4096  # the KV cache's static scales: maxima over more tokens clip fewer values
Tensor = tuple[np.ndarray, str]  # (host array, safetensors dtype)


def _quant_config(fmt: str, cfg: dict[str, Any]) -> dict[str, Any]:
    if fmt == "fp8":
        return {"quantization": "block_wise_fp8", "weight_block_size": [128, 128], "is_quantized": True}
    if fmt == "w4a8c8":
        return {"quantization": "mix_quant", "dense_quant_type": "wint8", "moe_quant_type": "w4a8",
                "kv_cache_quant_type": "int8", "is_permuted": False, "is_quantized": True}
    first, last = cfg.get("moe_layer_start_index", 0), cfg["num_hidden_layers"] - 1
    return {"dense_quant_type": "wint8", "moe_quant_type": "w4w2", "quantization": "wint2", "moe_quant_config": {
        "moe_w4_quant_config": {"quant_type": "wint4", "quant_granularity": "per_channel",
                                "quant_start_layer": 0, "quant_end_layer": first},
        "moe_w2_quant_config": {"quant_type": "wint2", "quant_granularity": "pp_acc", "quant_group_size": 64,
                                "quant_start_layer": first + 1, "quant_end_layer": last}}}


def _bf16(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _dense(fmt: str, w: np.ndarray) -> dict[str, Tensor]:
    if fmt == "fp8":
        codes, scales = quantize_block_fp8(w)
        return {"quant_weight": (np.ascontiguousarray(codes.T), "F8_E4M3"),
                "weight_scale": (np.ascontiguousarray(scales.T), "F32")}
    codes, scales = quantize_int8(w)
    return {"quant_weight": (codes, "I8"), "weight_scale": (scales, "F32")}


def _int4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    packed, scales = quantize_int4(w, -1)  # uint8 [out, in/2], amax/7 [out, 1]
    return np.ascontiguousarray(packed.T).view(np.int8), scales[:, 0]


def _expert(fmt: str, method: str, w: np.ndarray, act_max: float) -> dict[str, Tensor]:
    if fmt == "fp8":
        return _dense(fmt, w)
    if method == "wint2":
        qw, ws, sup, cs, zp = encode_wint2(w)
        return {"quant_weight": (qw, "U8"), "weight_scale": (ws, "U8"), "super_scales": (_bf16(sup), "BF16"),
                "code_scale": (cs, "F32"), "code_zp": (zp, "F32")}
    packed, scales = _int4(w)
    if method == "wint4":
        return {"quant_weight": (packed, "I8"), "weight_scale": (scales, "F32")}
    return {"quant_weight": (packed, "I8"), "weight_scale": (scales * np.float32(7), "F32"),
            "activation_scale": (np.array([act_max], dtype=np.float32), "F32")}


def _calibration(reader: SafetensorsFile, layer: int, norm: str, hidden: int, seed: int,
                 tokens: int = _CALIB_TOKENS) -> np.ndarray:
    rng = np.random.default_rng(seed * 1000 + layer)
    weight = reader.get(f"ernie.layers.{layer}.{norm}.weight").astype(np.float32)
    return (rng.standard_normal((tokens, hidden)).astype(np.float32) * weight)


def _silu_mul(h: np.ndarray) -> np.ndarray:
    gate, up = np.split(h, 2, axis=1)
    return gate / (1 + np.exp(-gate)) * up


def quantize_checkpoint(src: str | Path, out: str | Path, fmt: str, seed: int = 0) -> Path:
    """Write ``src`` (a float Paddle-named ERNIE checkpoint) to ``out`` in offline format ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown offline format {fmt!r}; expected one of {', '.join(FORMATS)}")
    src, out = Path(src), Path(out)
    cfg = json.loads((src / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and not item.name.endswith(".safetensors") and item.name != "model.safetensors.index.json":
            shutil.copy(item, out / item.name)
    qc = _quant_config(fmt, cfg)
    w4_end = qc.get("moe_quant_config", {}).get("moe_w4_quant_config", {}).get("quant_end_layer", -1)
    reader = SafetensorsFile(next(iter(sorted(src.glob("*.safetensors")))))
    tensors: dict[str, Tensor] = {}
    hidden, kv = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["head_dim"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    for name in reader.keys():
        dense, expert = _DENSE.match(name), _EXPERT.match(name)
        if dense is None and expert is None:
            tensors[name] = (np.array(reader.get_raw(name)), reader.dtype(name))
            continue
        w = reader.get(name).astype(np.float32)
        prefix = name[: -len(".weight")]
        if dense is not None:
            parts = _dense(fmt, w)
            if fmt == "w4a8c8" and dense.group(3) == "qkv":  # the int8 KV cache's per-channel maxima
                layer = int(dense.group(1))
                x = _calibration(reader, layer, "input_layernorm", hidden, seed, _KV_CALIB_TOKENS)
                k, v = x @ w[:, q:q + kv], x @ w[:, q + kv:q + 2 * kv]
                # k is cached after the (interleaved) rotary embedding, which turns each pair
                # (2i, 2i+1) by the position's angle: its bound is the pair's norm, not either value
                pair = np.sqrt(k[:, 0::2] ** 2 + k[:, 1::2] ** 2)
                for which, bound in (("cachek", np.repeat(pair, 2, axis=1)), ("cachev", np.abs(v))):
                    tensors[f"ernie.layers.{layer}.self_attn.{which}_matmul.activation_scale"] = (
                        bound.max(axis=0).astype(np.float32), "F32")
        elif expert is not None:
            layer = int(expert.group(1))
            method = "wint2" if fmt == "2bits" and layer > w4_end else ("wint4" if fmt == "2bits" else "w4a8")
            x = _calibration(reader, layer, "post_attention_layernorm", hidden, seed)
            if expert.group(3) == "down":
                up = reader.get(name.replace("down_proj", "up_gate_proj")).astype(np.float32)
                x = _silu_mul(x @ up)
            parts = _expert(fmt, method, w, float(np.abs(x).max()))
        for suffix, tensor in parts.items():
            tensors[f"{prefix}.{suffix}"] = tensor
    reader.close()
    _write(out / "model.safetensors", tensors)
    config = {**cfg, "is_quantized": True, "quantization_config": qc}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _write(path: Path, tensors: dict[str, Tensor]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "np"}}
    offset = 0
    for name, (array, dtype) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for array, _ in tensors.values():
            f.write(np.ascontiguousarray(array).tobytes())


def generate_offline_checkpoint(path: str | Path, fmt: str, shape: str = "tiny-moe", seed: int = 0,
                                **overrides: Any) -> tuple[Path, Path]:
    """Generate a float Paddle-named ``shape`` checkpoint under ``path/float``
    and its ``fmt`` form under ``path/fmt``; returns ``(float_dir, offline_dir)``."""
    from fd_core.testing.checkpoints import generate_checkpoint

    root = Path(path)
    float_dir = root / "float"
    if not (float_dir / "config.json").is_file():
        generate_checkpoint(float_dir, shape, naming="paddle", seed=seed, dtype="float32", **overrides)
    return float_dir, quantize_checkpoint(float_dir, root / fmt, fmt, seed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--format", choices=FORMATS, required=True)
    args = parser.parse_args(argv)
    print(quantize_checkpoint(args.src, args.out, args.format))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
