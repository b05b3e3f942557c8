"""ERNIE-4.5-VL's config.json: the text model (a ``ModelConfig``) plus the vision
tower, the resampler, the 3D rotary sections and the multimodal token ids.

Two spellings are read: HF transformers' nested one (``text_config`` /
``vision_config``, as ``Ernie4_5_VLMoeConfig`` saves it) and the released
checkpoints' flat one (text keys at the top level, ``moe_num_experts`` and
``moe_intermediate_size`` as ``[text, vision]`` lists, ``freq_allocation`` for
the temporal rotary section, ``im_patch_id``, ``spatial_conv_size``,
``temporal_conv_size``). ``fd_core.models.config.parse_config`` calls
``vl_config_from_dict`` for the VL architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fd_core.models.config import ConfigError, ModelConfig, config_from_dict

__all__ = ["VLModelConfig", "VisionConfig", "vl_config_from_dict"]


@dataclass(frozen=True)
class VisionConfig:
    """The adaptive-resolution ViT and the resampler's merge sizes."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int = 3
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_merge_size: int = 2
    layer_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class VLModelConfig(ModelConfig):
    """The text model's fields (``num_experts`` etc. are the text experts') plus the VL ones."""

    vision: VisionConfig | None = None
    vision_num_experts: int = 0
    vision_moe_intermediate_size: int = 0
    mrope_section: tuple[int, int, int] = (22, 22, 20)  # (height, width, temporal) rotary pairs
    sparse_layers: tuple[bool, ...] = ()  # layer -> MoE (True) or dense MLP
    image_token_id: int = 100295
    image_start_token_id: int = 101304
    image_end_token_id: int = 101305
    video_token_id: int = 103367
    video_start_token_id: int = 101306
    video_end_token_id: int = 101307

    def is_moe_layer(self, index: int) -> bool:
        return self.sparse_layers[index] if self.sparse_layers else super().is_moe_layer(index)


def _pair(value: Any, key: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return value[0], value[1]
    raise ConfigError(f"config.json: {key!r} must be an int or a [text, vision] pair, got {value!r}")


def _vision(raw: dict[str, Any], flat: dict[str, Any]) -> VisionConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"config.json: 'vision_config' must be an object, got {raw!r}")
    act = raw.get("hidden_act", "quick_gelu")
    if act != "quick_gelu":
        raise ConfigError(f"config.json: vision_config.hidden_act {act!r} is not supported (expected 'quick_gelu')")
    hidden = raw.get("hidden_size") or raw.get("embed_dim")
    heads = raw.get("num_heads") or raw.get("num_attention_heads")
    depth = raw.get("depth") or raw.get("num_hidden_layers")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, heads, depth)):
        raise ConfigError(f"config.json: vision_config needs positive depth, hidden_size and num_heads, "
                          f"got {depth!r}, {hidden!r}, {heads!r}")
    assert isinstance(hidden, int) and isinstance(heads, int) and isinstance(depth, int)
    inter = raw.get("intermediate_size") or int(hidden * raw.get("mlp_ratio", 4))
    rope: dict[str, Any] = raw.get("rope_parameters") or {}
    return VisionConfig(
        depth=depth, hidden_size=hidden, intermediate_size=int(inter), num_heads=heads,
        in_channels=int(raw.get("in_channels") or raw.get("in_chans") or 3),
        patch_size=int(raw.get("patch_size", 14)),
        spatial_merge_size=int(raw.get("spatial_merge_size", flat.get("spatial_conv_size", 2))),
        temporal_merge_size=int(raw.get("temporal_merge_size", flat.get("temporal_conv_size", 2))),
        layer_norm_eps=float(raw.get("rms_norm_eps") or raw.get("layer_norm_eps") or 1e-6),
        rope_theta=float(rope.get("rope_theta") or raw.get("rope_theta") or 10000.0),
    )


def vl_config_from_dict(raw: dict[str, Any]) -> VLModelConfig:
    """Validate an ERNIE-4.5-VL config.json (nested HF or flat release spelling)."""
    nested = isinstance(raw.get("text_config"), dict)
    text = dict(raw["text_config"]) if nested else dict(raw)
    text["architectures"] = raw.get("architectures")
    text.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", True))
    if "fd_generated" in raw:
        text["fd_generated"] = raw["fd_generated"]
    experts_text, experts_vision = _pair(text.get("moe_num_experts", 0), "moe_num_experts")
    inter_text, inter_vision = _pair(text.get("moe_intermediate_size", 0), "moe_intermediate_size")
    text["moe_num_experts"], text["moe_intermediate_size"] = experts_text, inter_text
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = rope.get("mrope_section") if isinstance(rope, dict) else None
    text["rope_parameters"] = {k: v for k, v in rope.items() if k != "mrope_section"} if isinstance(rope, dict) \
        else rope
    base = config_from_dict(text)
    if section is None:
        t = int(text.get("freq_allocation", 20))
        half = base.head_dim // 2
        section = [(half - t) // 2, (half - t) // 2, t]
    if len(section) != 3 or section[0] != section[1] or sum(section) != base.head_dim // 2:
        raise ConfigError(f"config.json: mrope_section {section} must be [h, w, t] with h == w and "
                          f"h + w + t == head_dim / 2 = {base.head_dim // 2}")
    layer_types = text.get("mlp_layer_types")
    if layer_types is not None:
        if len(layer_types) != base.num_layers or set(layer_types) - {"dense", "sparse"}:
            raise ConfigError(f"config.json: mlp_layer_types must list 'dense'/'sparse' for each of the "
                              f"{base.num_layers} layers, got {layer_types!r}")
        sparse = tuple(t == "sparse" for t in layer_types)
    elif nested:  # HF's default: the first layer dense, the rest sparse
        sparse = (False,) + (True,) * (base.num_layers - 1)
    else:
        sparse = tuple(base.is_moe_layer(i) for i in range(base.num_layers))
    if any(sparse) and not experts_vision:
        raise ConfigError("config.json: a VL MoE layer needs vision experts (moe_num_experts [text, vision])")
    ids: dict[str, Any] = {k: raw.get(k, text.get(k)) for k in ("image_token_id", "image_start_token_id", "image_end_token_id",
                                                  "video_token_id", "video_start_token_id", "video_end_token_id")}
    if ids["image_token_id"] is None and "im_patch_id" in raw:
        ids["image_token_id"] = raw["im_patch_id"]
    if "vision_config" not in raw:
        raise ConfigError("config.json: an ERNIE-4.5-VL config needs 'vision_config'")
    fields: dict[str, Any] = {f: getattr(base, f) for f in base.__dataclass_fields__}
    fields.update({k: int(v) for k, v in ids.items() if v is not None})
    return VLModelConfig(
        **fields,
        vision=_vision(raw["vision_config"], raw),
        vision_num_experts=experts_vision,
        vision_moe_intermediate_size=inter_vision,
        mrope_section=(int(section[0]), int(section[1]), int(section[2])),
        sparse_layers=sparse,
    )


def with_overrides(config: VLModelConfig, **changes: Any) -> VLModelConfig:
    """A copy with ``changes`` (tests)."""
    return replace(config, **changes)
