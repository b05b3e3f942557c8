"""Malformed checkpoints are rejected with a message naming what is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from fd_core.model_loader import CheckpointError, load_model, resolve_model_path
from fd_core.model_loader.discovery import ModelNotFoundError
from fd_core.models import UnknownArchitectureError
from fd_core.models.config import ConfigError


@pytest.fixture
def broken(tmp_path, checkpoint_factory):
    """A fresh, editable copy of the tiny dense checkpoint (float32 weights)."""
    src = checkpoint_factory("tiny-dense", "pytorch", dtype="float32")
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def _edit_weights(model_dir: Path, edit) -> None:
    path = model_dir / "model.safetensors"
    tensors = dict(load_file(path))
    edit(tensors)
    save_file(tensors, path)


def _edit_config(model_dir: Path, **changes) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_the_copy_loads(broken, cpu_backend):
    model = load_model(broken, cpu_backend.ops)
    assert model.config.generated


def test_missing_tensor_is_named(broken, cpu_backend):
    _edit_weights(broken, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor.*model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_model(broken, cpu_backend.ops)


def test_wrong_shape_is_named(broken, cpu_backend):
    def edit(t):
        t["model.layers.0.mlp.down_proj.weight"] = np.zeros((3, 5), dtype=np.float32)

    _edit_weights(broken, edit)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.down_proj\.weight.*shape \[3, 5\]"):
        load_model(broken, cpu_backend.ops)


def test_unexpected_tensor_is_named(broken, cpu_backend):
    def edit(t):
        t["model.layers.0.self_attn.extra.weight"] = np.zeros((2,), dtype=np.float32)

    _edit_weights(broken, edit)
    with pytest.raises(CheckpointError, match=r"self_attn\.extra\.weight"):
        load_model(broken, cpu_backend.ops)


def test_unknown_architecture(broken, cpu_backend):
    _edit_config(broken, architectures=["LlamaForCausalLM"])
    with pytest.raises(UnknownArchitectureError, match=r"LlamaForCausalLM.*Ernie4_5ForCausalLM"):
        load_model(broken, cpu_backend.ops)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
        ({"hidden_size": "big"}, "'hidden_size' must be int"),
        ({"num_hidden_layers": 0}, "'num_hidden_layers' must be positive"),
        ({"architectures": []}, "'architectures' must be a non-empty list"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4}}, "rope type 'yarn'"),
    ],
)
def test_bad_config(broken, cpu_backend, changes, message):
    _edit_config(broken, **changes)
    with pytest.raises(ConfigError, match=message):
        load_model(broken, cpu_backend.ops)


def test_missing_key_in_config(broken, cpu_backend):
    config = json.loads((broken / "config.json").read_text())
    del config["vocab_size"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="missing required key 'vocab_size'"):
        load_model(broken, cpu_backend.ops)


def test_config_not_json(broken, cpu_backend):
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model(broken, cpu_backend.ops)


def test_corrupt_safetensors(broken, cpu_backend):
    (broken / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_model(broken, cpu_backend.ops)


def test_no_weights(broken, cpu_backend):
    (broken / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        load_model(broken, cpu_backend.ops)


def test_index_naming_a_missing_shard(broken, cpu_backend):
    (broken / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_model(broken, cpu_backend.ops)


def test_sharded_checkpoint_loads(tmp_path, checkpoint_factory, cpu_backend):
    sharded = checkpoint_factory("tiny-moe", "paddle", shards=3)
    whole = checkpoint_factory("tiny-moe", "paddle")
    a = load_model(sharded, cpu_backend.ops)
    b = load_model(whole, cpu_backend.ops)
    for (name, pa), (_, pb) in zip(a.parameters().items(), b.parameters().items()):
        assert np.array_equal(pa.data.numpy(), pb.data.numpy()), name


def test_model_path_resolution(tmp_path, monkeypatch, broken):
    assert resolve_model_path(str(broken)) == broken
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model_path(str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="does not look like a hub id"):
        resolve_model_path(str(tmp_path / "nope"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE is set"):
        resolve_model_path("baidu/ERNIE-4.5-0.3B-PT")
