"""Big generated checkpoints (ERNIE-4.5-21B-A3B: 42 GB of bf16), written shard by shard.

``fd_core.testing.checkpoints`` draws every value with ``standard_normal`` in
fp32 and rounds it to bf16: right for the small test shapes, about an hour of
two cores for 21e9 values. Here each bf16 tensor is drawn as random 16-bit
indices into a 65536-entry table of bf16 normal quantiles (the table of the
tensor's std), ``chunk`` elements at a time, and written straight to its
shard: the values are normally distributed as there, at ~150 M values/s per
core, and memory stays at one chunk whatever the model size. Tensor names,
shapes, scales (``checkpoints._scale``), config.json, the tokenizer and the
PyTorch layout (``baidu/ERNIE-4.5-21B-A3B-PT``: ``model.layers.N.mlp.experts.E.gate_proj.weight``, ...)
are those of ``checkpoints``; the values differ (another generator), so a
streamed checkpoint is its own seeded model, byte-identical for a seed.

Shards (``model-0000i-of-0000N.safetensors`` + ``model.safetensors.index.json``,
about ``shard_bytes`` each, a tensor never split) are written to ``*.partial``
and renamed when complete; a finished checkpoint has the marker file
``GENERATED``. A rerun skips the shards already there (resumable), and a
finished checkpoint is returned as it is. Called by ``benchmarks/real_size.py``.
"""

from __future__ import annotations

import json
import math
import statistics
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from fd_core.testing import checkpoints as ckpt

__all__ = ["MARKER", "bf16_normal_table", "generate_streamed_checkpoint", "shard_plan"]

MARKER = "GENERATED"
_CHUNK = 1 << 24  # elements drawn and written at a time (32 MB of bf16)


def bf16_normal_table(std: float, mean: float = 0.0) -> np.ndarray:
    """65536 bf16 bit patterns (uint16): ``mean + std *`` the normal quantiles at (i + 0.5) / 65536."""
    inv = statistics.NormalDist().inv_cdf
    quantiles = np.array([inv((i + 0.5) / 65536) for i in range(65536)], dtype=np.float64)
    values = (mean + std * quantiles).astype(np.float32)
    bits = values.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype(np.uint16)


def shard_plan(specs: Sequence[ckpt.TensorSpec], shard_bytes: int) -> list[list[ckpt.TensorSpec]]:
    """Tensors in order, cut into shards of about ``shard_bytes`` (a shard closes once it reaches it)."""
    if shard_bytes < 1:
        raise ValueError(f"shard_bytes must be >= 1, got {shard_bytes}")
    shards: list[list[ckpt.TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + ckpt._nbytes(spec) > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += ckpt._nbytes(spec)
    return shards


def _scale(name: str, shape: tuple[int, ...], cfg: dict[str, Any]) -> tuple[float, float]:
    """(mean, std) of a bf16 tensor, as ``checkpoints._source_tensor`` scales it."""
    if name.endswith("norm.weight"):
        return 1.0, 0.05
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return 0.0, 2.5 / math.sqrt(cfg["hidden_size"])
    std = 1.0 / math.sqrt(shape[1])
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        std *= ckpt._RESIDUAL_GAIN / math.sqrt(cfg["num_hidden_layers"])
    return 0.0, std


def _write_bf16(f: BinaryIO, spec: ckpt.TensorSpec, cfg: dict[str, Any], seed: int, chunk: int) -> None:
    """One bf16 tensor, drawn through its quantile table ``chunk`` elements at a time."""
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    mean, std = _scale(spec.name, spec.shape, cfg)
    table = bf16_normal_table(std, mean)
    embedding = spec.name.endswith(("embed_tokens.weight", "lm_head.weight"))
    row = spec.shape[-1] if len(spec.shape) == 2 else 1
    if embedding:  # as checkpoints: padding rows small, column 0 flags real (+5) vs padding (-5) rows
        small = bf16_normal_table(std * 0.02)
        flag = bf16_normal_table(0.0, ckpt._REAL_TOKEN_FLAG)[0]
        chunk = max(row, chunk // row * row)
    total = math.prod(spec.shape)
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        draw = rng.integers(0, 65536, n, dtype=np.uint16)
        if not embedding:
            table[draw].astype("<u2", copy=False).tofile(f)
            continue
        rows = draw.reshape(-1, row)
        first = start // row
        real = max(0, min(rows.shape[0], ckpt._TOKENIZER_PIECES - first))
        out = np.empty_like(rows)
        out[:real], out[real:] = table[rows[:real]], small[rows[real:]]
        out[:real, 0], out[real:, 0] = flag, flag | np.uint16(0x8000)
        out.astype("<u2", copy=False).tofile(f)


def _write_shard(path: Path, specs: Sequence[ckpt.TensorSpec], cfg: dict[str, Any], seed: int,
                 chunk: int) -> None:
    """One safetensors shard, header first, via ``path.partial`` (renamed when complete)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for s in specs:
        header[s.name] = {"dtype": ckpt._ST_DTYPES[s.dtype], "shape": list(s.shape),
                          "data_offsets": [offset, offset + ckpt._nbytes(s)]}
        offset += ckpt._nbytes(s)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    partial = path.with_name(path.name + ".partial")
    shapes = {s.name: s.shape for s in specs}
    with open(partial, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for s in specs:
            if s.dtype == "bfloat16":
                _write_bf16(f, s, cfg, seed, chunk)
            else:  # the fp32 router gates and correction biases: small, drawn as checkpoints draws them
                ckpt._write_array(f, ckpt._source_tensor(s.name, shapes[s.name], cfg, seed), s.dtype)
    partial.rename(path)


def generate_streamed_checkpoint(path: str | Path, shape: str = "21b-a3b", seed: int = 0,
                                 shard_bytes: int = 5 << 30, chunk: int = _CHUNK, log: Any = None,
                                 **overrides: Any) -> Path:
    """Write (or finish, or find) a bf16 PyTorch-naming checkpoint of ``shape`` under ``path``.

    ``shape`` is an ERNIE 4.5 shape of ``checkpoints.SHAPES`` (``overrides``
    replace config keys); ``log`` (e.g. ``print``) gets a line per shard.
    Returns the directory; its ``GENERATED`` file holds the settings, and a
    directory whose marker names other settings is refused (ValueError).
    """
    if shape not in ckpt.SHAPES:
        raise ValueError(f"unknown ERNIE 4.5 checkpoint shape {shape!r}; expected one of {sorted(ckpt.SHAPES)}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    out = Path(path)
    settings = {"shape": shape, "seed": seed, "shard_bytes": shard_bytes, "overrides": overrides,
                "generator": "fd_core.testing.streamed_checkpoints"}
    marker = out / MARKER
    if marker.is_file():
        found = json.loads(marker.read_text())
        if found != settings:
            raise ValueError(f"{out} holds a generated checkpoint of other settings ({found}); expected "
                             f"{settings}: remove the directory or pass another one")
        return out
    cfg = {**ckpt.SHAPES[shape], **overrides}
    out.mkdir(parents=True, exist_ok=True)
    sep_id = ckpt._write_tokenizer(out, cfg)
    arch = ckpt._ARCHITECTURES[cfg["model_type"], "pytorch"]
    ckpt._write_json(out / "config.json", {
        "architectures": [arch], **cfg, "torch_dtype": "bfloat16", "dtype": "bfloat16",
        "fd_generated": {"seed": seed, "shape": shape, "naming": "pytorch", "generator": settings["generator"],
                         "note": "random weights generated by fd_core.testing; not a trained model"}})
    ckpt._write_json(out / "generation_config.json", {
        "bos_token_id": cfg["bos_token_id"], "pad_token_id": cfg["pad_token_id"],
        "eos_token_id": [cfg["eos_token_id"], sep_id]})
    specs = ckpt.pytorch_tensor_specs(cfg, "bfloat16")
    shards = shard_plan(specs, shard_bytes)
    weight_map: dict[str, str] = {}
    for i, group in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        weight_map.update({s.name: name for s in group})
        if (out / name).is_file():
            continue
        _write_shard(out / name, group, cfg, seed, chunk)
        if log is not None:
            log(f"  wrote {name} ({sum(ckpt._nbytes(s) for s in group) / 1e9:.2f} GB, {len(group)} tensors)")
    ckpt._write_json(out / "model.safetensors.index.json", {
        "metadata": {"total_size": sum(ckpt._nbytes(s) for s in specs)}, "weight_map": weight_map})
    marker.write_text(json.dumps(settings) + "\n")
    return out
