"""Qwen3's config.json parser: HF's keys and defaults, refusals by key, dispatch by architecture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fd_core.models.config import (
    ConfigError,
    ModelConfig,
    load_config,
    parse_config,
    register_config_parser,
)

RAW = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1000000, "eos_token_id": 151645,
}


def test_qwen3_keys_and_defaults() -> None:
    c = parse_config(RAW)
    assert (c.architecture, c.head_dim, c.num_heads, c.num_kv_heads) == ("Qwen3ForCausalLM", 128, 16, 8)
    assert c.head_dim * c.num_heads != c.hidden_size  # explicit head_dim is kept
    assert c.rope_theta == 1e6 and c.eos_token_ids == (151645,)
    assert c.tie_word_embeddings is False and c.rms_norm_eps == 1e-6  # Qwen3Config's defaults, not ERNIE's
    no_head_dim = {k: v for k, v in RAW.items() if k != "head_dim"}
    assert parse_config(no_head_dim).head_dim == 64
    new_rope = {**RAW, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6}}
    assert parse_config(new_rope).rope_theta == 5e6  # transformers 5 spelling


@pytest.mark.parametrize("key, value, match", [
    ("attention_bias", True, "attention_bias"),
    ("use_sliding_window", True, "use_sliding_window"),
    ("layer_types", ["full_attention", "sliding_attention"], "sliding_attention"),
    ("hidden_act", "gelu", "hidden_act"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "yarn"),
    ("num_key_value_heads", 3, "multiple"),
])
def test_unsupported_keys_are_refused_by_name(key: str, value: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config({**RAW, key: value})


def test_a_plugin_parser_is_used_for_its_architecture(tmp_path: Path) -> None:
    seen = []

    def parser(raw: dict) -> ModelConfig:
        seen.append(raw["architectures"][0])
        return parse_config({**RAW, "architectures": ["Qwen3ForCausalLM"]})

    register_config_parser("FdTestOnlyForCausalLM", parser)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FdTestOnlyForCausalLM"]}))
    assert load_config(tmp_path).head_dim == 128
    assert seen == ["FdTestOnlyForCausalLM"]
