"""fd_core.testing.streamed_checkpoints on the tiny MoE shape: layout, values, shards, resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fd_core.model_loader.safetensors_io import SafetensorsFile
from fd_core.testing import checkpoints as ckpt
from fd_core.testing.streamed_checkpoints import (
    MARKER,
    bf16_normal_table,
    generate_streamed_checkpoint,
    shard_plan,
)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-moe, seed 3, small shards and chunks (each generation trains a tokenizer: ~4 s)."""
    return generate_streamed_checkpoint(tmp_path_factory.mktemp("streamed") / "m", "tiny-moe", seed=3,
                                        shard_bytes=40_000, chunk=1000)


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _tensors(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(path.glob("*.safetensors")):
        reader = SafetensorsFile(f)
        for name in reader.keys():
            raw = np.array(reader.get_raw(name))
            out[name] = _bf16_to_f32(raw.view(np.uint16)) if reader.dtype(name) in ("BF16", "bfloat16") else raw
        reader.close()
    return out


def test_the_21b_shape_is_the_published_one() -> None:
    cfg = ckpt.SHAPES["21b-a3b"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["vocab_size"]) == (2560, 28, 20, 4, 128, 103424)
    assert (cfg["moe_num_experts"], cfg["moe_k"], cfg["moe_intermediate_size"], cfg["moe_num_shared_experts"],
            cfg["intermediate_size"], cfg["moe_layer_start_index"]) == (64, 6, 1536, 2, 12288, 1)
    params = sum(int(np.prod(s.shape)) for s in ckpt.pytorch_tensor_specs(cfg))
    assert 21.5e9 < params < 22.0e9  # "21B": 21.83 B with the tied embedding once


def test_the_quantile_table_is_a_normal_distribution_in_bf16() -> None:
    values = _bf16_to_f32(bf16_normal_table(0.02, 1.0))
    assert np.all(np.diff(values) >= 0)
    assert abs(values.mean() - 1.0) < 1e-3 and abs(values.std() / 0.02 - 1) < 0.02


def test_shards_keep_tensors_whole_in_order() -> None:
    specs = ckpt.pytorch_tensor_specs(ckpt.SHAPES["tiny-moe"])
    shards = shard_plan(specs, 40_000)
    assert [s for group in shards for s in group] == specs
    assert len(shards) > 3 and all(group for group in shards)
    with pytest.raises(ValueError, match="shard_bytes must be >= 1, got 0"):
        shard_plan(specs, 0)


def test_a_streamed_checkpoint_has_the_pytorch_layout_and_scales(made: Path) -> None:
    out = made
    cfg = ckpt.SHAPES["tiny-moe"]
    specs = {s.name: s for s in ckpt.pytorch_tensor_specs(cfg)}
    tensors = _tensors(out)
    assert tensors.keys() == specs.keys()
    assert all(tensors[n].shape == s.shape for n, s in specs.items())
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"].keys() == specs.keys()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Ernie4_5_MoeForCausalLM"] and config["torch_dtype"] == "bfloat16"
    assert (out / "tokenizer.model").is_file()
    up = tensors["model.layers.1.mlp.experts.0.up_proj.weight"]
    assert abs(up.std() * np.sqrt(cfg["hidden_size"]) - 1) < 0.1  # std 1/sqrt(fan_in), as checkpoints
    norm = tensors["model.layers.0.input_layernorm.weight"]
    assert abs(norm.mean() - 1) < 0.05
    embed = tensors["model.embed_tokens.weight"]
    assert np.all(embed[:, 0] == ckpt._REAL_TOKEN_FLAG)  # tiny vocab: every row a real piece
    # generic gates stay fp32, drawn as checkpoints draws them
    gate = "model.layers.1.mlp.gate.weight"
    assert tensors[gate].dtype == np.float32


def test_a_rerun_resumes_and_a_finished_one_is_kept(made: Path, tmp_path: Path) -> None:
    out = Path(shutil.copytree(made, tmp_path / "m"))
    shards = sorted(out.glob("*.safetensors"))
    before = {p.name: p.read_bytes() for p in shards}
    (out / MARKER).unlink()
    shards[2].unlink()
    (out / (shards[3].name + ".partial")).write_bytes(b"half")  # an interrupted write
    generate_streamed_checkpoint(out, "tiny-moe", seed=3, shard_bytes=40_000, chunk=1000)
    assert {p.name: p.read_bytes() for p in sorted(out.glob("*.safetensors"))} == before
    mtime = shards[0].stat().st_mtime_ns
    assert generate_streamed_checkpoint(out, "tiny-moe", seed=3, shard_bytes=40_000) == out
    assert shards[0].stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match="other settings"):
        generate_streamed_checkpoint(out, "tiny-moe", seed=1, shard_bytes=40_000)


def test_the_chunk_size_and_shards_do_not_change_the_values(made: Path, tmp_path: Path) -> None:
    a = made
    b = generate_streamed_checkpoint(tmp_path / "b", "tiny-moe", seed=3, shard_bytes=1 << 30, chunk=1 << 20)
    ta, tb = _tensors(a), _tensors(b)
    assert all(np.array_equal(ta[k], tb[k]) for k in ta)
