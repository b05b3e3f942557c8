"""Model configuration read from a checkpoint's config.json.

One frozen dataclass for every family; a parser per architecture fills it
(``config_from_dict``: ERNIE 4.5 dense and MoE, and the default for an
architecture with no parser of its own; ``qwen3_config_from_dict``: Qwen3).
Every key is validated and a bad or missing one is named in the error. A
model plugin brings its own parser with ``register_config_parser`` (from its
``fd_register_models`` hook); ``load_config`` loads general plugins before
parsing an architecture that is not built in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "ConfigParser", "ModelConfig", "load_config", "parse_config",
           "qwen3_config_from_dict", "register_config_parser"]


class ConfigError(ValueError):
    """config.json is missing, unreadable or describes an unsupported model."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    # MoE (num_experts == 0: dense model)
    num_experts: int = 0
    moe_k: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    moe_layer_start_index: int = 0
    moe_layer_end_index: int = -1
    moe_layer_interval: int = 1
    moe_norm_min: float = 1e-12
    moe_use_correction_bias: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    generated: bool = False  # made by fd_core.testing.checkpoints (random weights)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        """ERNIE's rule: MoE from start to end index (inclusive), every interval."""
        end = self.num_layers - 1 if self.moe_layer_end_index < 0 else self.moe_layer_end_index
        return (
            self.is_moe
            and (index + 1) % self.moe_layer_interval == 0
            and self.moe_layer_start_index <= index <= end
        )


def _get(raw: dict[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    if key not in raw or raw[key] is None:
        if default is ...:
            raise ConfigError(f"config.json: missing required key {key!r}")
        return default
    value = raw[key]
    if isinstance(value, list) and kind is int and value and all(isinstance(v, int) for v in value):
        value = value[0]  # VL configs list [text, vision] sizes; the text model uses the first
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"config.json: {key!r} must be {kind.__name__}, got {value!r}")
    return value


def _positive(name: str, value: int) -> int:
    if value <= 0:
        raise ConfigError(f"config.json: {name!r} must be positive, got {value}")
    return value


def _rope_theta(raw: dict[str, Any]) -> float:
    params = raw.get("rope_parameters") or raw.get("rope_scaling")
    if isinstance(params, dict):
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"config.json: rope type {rope_type!r} is not supported (only 'default')")
        if "rope_theta" in params:
            return float(params["rope_theta"])
    return float(_get(raw, "rope_theta", float, 10000.0))


def _attention_shape(raw: dict[str, Any]) -> tuple[list[str], int, int, int]:
    """``(architectures, hidden_size, num_attention_heads, num_key_value_heads)``, checked."""
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError(f"config.json: 'architectures' must be a non-empty list of names, got {archs!r}")
    hidden = _positive("hidden_size", _get(raw, "hidden_size", int))
    heads = _positive("num_attention_heads", _get(raw, "num_attention_heads", int))
    kv_heads = _positive("num_key_value_heads", _get(raw, "num_key_value_heads", int, heads))
    if heads % kv_heads:
        raise ConfigError(
            f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    return archs, hidden, heads, kv_heads


def config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """Validate a config.json dict (ERNIE 4.5 keys, dense or MoE)."""
    archs, hidden, heads, kv_heads = _attention_shape(raw)
    head_dim = _positive("head_dim", _get(raw, "head_dim", int, hidden // heads))
    if _get(raw, "use_bias", bool, False):
        raise ConfigError("config.json: use_bias=true is not supported (ERNIE 4.5 has no linear biases)")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"config.json: hidden_act {act!r} is not supported (expected 'silu')")
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    num_experts = _get(raw, "moe_num_experts", int, 0)
    moe: dict[str, Any] = {}
    if num_experts:
        moe = dict(
            num_experts=num_experts,
            moe_k=_positive("moe_k", _get(raw, "moe_k", int)),
            moe_intermediate_size=_positive(
                "moe_intermediate_size", _get(raw, "moe_intermediate_size", int)
            ),
            num_shared_experts=_get(raw, "moe_num_shared_experts", int, 0),
            moe_layer_start_index=_get(raw, "moe_layer_start_index", int, 0),
            moe_layer_end_index=_get(raw, "moe_layer_end_index", int, -1),
            moe_layer_interval=_positive("moe_layer_interval", _get(raw, "moe_layer_interval", int, 1)),
            moe_norm_min=_get(raw, "moe_norm_min", float, 1e-12),
            moe_use_correction_bias=_get(raw, "moe_use_aux_free", bool, True),
        )
        if moe["moe_k"] > num_experts:
            raise ConfigError(f"config.json: moe_k {moe['moe_k']} exceeds moe_num_experts {num_experts}")
    return ModelConfig(
        architecture=archs[0],
        model_type=str(raw.get("model_type", "")),
        vocab_size=_positive("vocab_size", _get(raw, "vocab_size", int)),
        hidden_size=hidden,
        num_layers=_positive("num_hidden_layers", _get(raw, "num_hidden_layers", int)),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_positive("intermediate_size", _get(raw, "intermediate_size", int)),
        max_position_embeddings=_positive(
            "max_position_embeddings", _get(raw, "max_position_embeddings", int)
        ),
        rms_norm_eps=_get(raw, "rms_norm_eps", float, 1e-5),
        rope_theta=_rope_theta(raw),
        tie_word_embeddings=_get(raw, "tie_word_embeddings", bool, True),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_ids,
        pad_token_id=raw.get("pad_token_id"),
        generated="fd_generated" in raw,
        **moe,
    )


def _eos_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())


def qwen3_config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """Validate a Qwen3 (dense) config.json, as HF's ``Qwen3Config`` spells it.

    Qwen3's defaults differ from ERNIE's where a key is absent (untied
    embeddings, eps 1e-6); what the model does not implement (attention
    biases, sliding-window layers, a non-SiLU MLP) is refused by key."""
    archs, hidden, heads, kv_heads = _attention_shape(raw)
    if _get(raw, "attention_bias", bool, False):
        raise ConfigError("config.json: attention_bias=true is not supported for Qwen3 (expected false)")
    if _get(raw, "use_sliding_window", bool, False):
        raise ConfigError("config.json: use_sliding_window=true is not supported (every layer attends fully)")
    layer_types = raw.get("layer_types") or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise ConfigError(f"config.json: layer_types {other} are not supported (only 'full_attention')")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"config.json: hidden_act {act!r} is not supported (expected 'silu')")
    return ModelConfig(
        architecture=archs[0],
        model_type=str(raw.get("model_type", "")),
        vocab_size=_positive("vocab_size", _get(raw, "vocab_size", int)),
        hidden_size=hidden,
        num_layers=_positive("num_hidden_layers", _get(raw, "num_hidden_layers", int)),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_positive("head_dim", _get(raw, "head_dim", int, hidden // heads)),
        intermediate_size=_positive("intermediate_size", _get(raw, "intermediate_size", int)),
        max_position_embeddings=_positive(
            "max_position_embeddings", _get(raw, "max_position_embeddings", int, 32768)
        ),
        rms_norm_eps=_get(raw, "rms_norm_eps", float, 1e-6),
        rope_theta=_rope_theta(raw),
        tie_word_embeddings=_get(raw, "tie_word_embeddings", bool, False),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos_ids(raw),
        pad_token_id=raw.get("pad_token_id"),
        generated="fd_generated" in raw,
    )


ConfigParser = Callable[[dict[str, Any]], ModelConfig]
def _ernie_vl_config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    from fd_core.models.ernie4_5_vl_config import vl_config_from_dict  # imports this module

    return vl_config_from_dict(raw)


# architecture -> parser; an architecture not listed (after plugins load) is parsed as ERNIE 4.5
_PARSERS: dict[str, ConfigParser] = {"Qwen3ForCausalLM": qwen3_config_from_dict,
                                     "Ernie4_5_VLMoeForConditionalGeneration": _ernie_vl_config_from_dict}
_ERNIE = ("Ernie4_5ForCausalLM", "Ernie4_5_ForCausalLM", "Ernie4_5_MoeForCausalLM")


def register_config_parser(architecture: str, parser: ConfigParser) -> None:
    """Parse config.json of ``architecture`` with ``parser`` (a model plugin
    calls this from its ``fd_register_models`` hook)."""
    _PARSERS[architecture] = parser


def parse_config(raw: dict[str, Any]) -> ModelConfig:
    """Validate a config.json dict with its architecture's parser."""
    archs = raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is not None and arch not in _PARSERS and arch not in _ERNIE:
        from fd_core.models import registry

        registry.supported()  # loads general plugins once: they may register a parser
    return _PARSERS.get(arch or "", config_from_dict)(raw)


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read and validate ``model_dir/config.json``."""
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} not found: is {model_dir} a model directory?") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    return parse_config(raw)
