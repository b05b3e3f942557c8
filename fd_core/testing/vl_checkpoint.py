"""Generated ERNIE-4.5-VL checkpoints (``tiny-vl``): seeded random weights in the
real on-disk layouts, the ERNIE tokenizer (its ``<|IMAGE_*|>`` control tokens
are the multimodal markers), HF's image-processor config and its video-processor config
(``video_preprocessor_config.json``, with a TrueType font for the frame timestamps copied next
to it from the system fonts when there is one: HF's processor refuses to load without it).

- "pytorch": tensor names and ``[out, in]`` layouts as HF transformers saves
  ``Ernie4_5_VLMoeForConditionalGeneration`` (its conversion mapping is the
  baidu/ERNIE-4.5-VL-*-PT layout: ``model.layers``, ``model.vision_model``,
  ``model.resampler_model.spatial_linear.{0,2,3}``, experts ``0..E-1`` text and
  ``E..2E-1`` vision, routers ``mlp.gate.weight`` / ``mlp.gate.weight_1`` as
  ``[hidden, experts]``, ``moe_statics.e_score_correction_bias`` ``[2, E]``);
  config.json in HF's nested spelling (``text_config`` / ``vision_config``).
- "paddle": the -Paddle releases: ``ernie.`` prefix, ``[in, out]``, fused
  ``qkv_proj`` / ``up_gate_proj``, ``vision_model.``, ``ernie.resampler_model.``;
  config.json in the releases' flat spelling (``moe_num_experts: [text, vision]``).

Registered in ``fd_core.testing.generators``; the same seed gives the same model
in both namings.
"""

from __future__ import annotations

import math
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from fd_core.testing.checkpoints import (
    _ST_DTYPES,
    TensorSpec,
    _build,
    _source_tensor,
    _write_json,
    _write_safetensors,
    _write_tokenizer,
)

__all__ = ["SYSTEM_FONTS", "VL_SHAPES", "generate_vl_checkpoint", "system_font", "vl_tensor_specs"]

# fmt: off
VL_SHAPES: dict[str, dict[str, Any]] = {
    "tiny-vl": {
        "text": {
            "vocab_size": 2048, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "hidden_act": "silu", "use_bias": False,
            "tie_word_embeddings": True, "moe_num_experts": 4, "moe_k": 2, "moe_num_shared_experts": 1,
            "moe_intermediate_size": [32, 24], "moe_norm_min": 1e-12, "mlp_layer_types": ["dense", "sparse"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [2, 2, 4]},
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        },
        "vision": {
            "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
            "patch_size": 14, "spatial_merge_size": 2, "temporal_merge_size": 2, "hidden_act": "quick_gelu",
            "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
        },
        # pixel budget of the image processor: at most 16 merged tokens per image
        "min_pixels": 28 * 28, "max_pixels": 28 * 28 * 16,
        # the video processor's: 4 to 16 merged patches per frame, every frame of a short clip
        "video": {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16, "min_frames": 1, "max_frames": 180},
    },
    # benchmarks/vl_ttft.py: the released vision tower's width (1280, 16 heads, MLP 5120) at 4 of its 32
    # layers, the processor's real pixel budget (a 448x448 image: 1024 patches, 256 LM tokens), a small
    # MoE language model (4 layers, width 512)
    "bench-vl": {
        "text": {
            "vocab_size": 2048, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
            "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu", "use_bias": False,
            "tie_word_embeddings": True, "moe_num_experts": 8, "moe_k": 2, "moe_num_shared_experts": 1,
            "moe_intermediate_size": [256, 256], "moe_norm_min": 1e-12,
            "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [11, 11, 10]},
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        },
        "vision": {
            "depth": 4, "hidden_size": 1280, "intermediate_size": 5120, "num_heads": 16, "in_channels": 3,
            "patch_size": 14, "spatial_merge_size": 2, "temporal_merge_size": 2, "hidden_act": "quick_gelu",
            "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
        },
        "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 6177,
        "video": {"min_pixels": 299 * 28 * 28, "max_pixels": 1196 * 28 * 28, "min_frames": 16, "max_frames": 180},
    },
}
# fmt: on
# TrueType fonts the Debian / Fedora font packages install (fonts-dejavu-core, dejavu-sans-fonts)
SYSTEM_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf")
_TOKENS = {"image_token_id": "<|IMAGE_PLACEHOLDER|>", "image_start_token_id": "<|IMAGE_START|>",
           "image_end_token_id": "<|IMAGE_END|>", "video_start_token_id": "<|VIDEO_START|>",
           "video_end_token_id": "<|VIDEO_END|>",
           # the tokenizer has no <|VIDEO_PLACEHOLDER|>: a control token no prompt holds stands in
           "video_token_id": "<|AUDIO_PLACEHOLDER|>"}


def vl_tensor_specs(text: dict[str, Any], vision: dict[str, Any], dtype: str) -> list[TensorSpec]:
    """The PyTorch-naming tensors (HF's saved layout) of a VL checkpoint."""
    h, d, v = text["hidden_size"], text["head_dim"], vision["hidden_size"]
    q, kv = text["num_attention_heads"] * d, text["num_key_value_heads"] * d
    experts = text["moe_num_experts"]
    inter_t, inter_v = text["moe_intermediate_size"]
    specs: list[tuple[str, tuple[int, ...], str]] = [("model.embed_tokens.weight", (text["vocab_size"], h), dtype)]

    def mlp(prefix: str, inter: int) -> None:
        specs.extend([(f"{prefix}.gate_proj.weight", (inter, h), dtype), (f"{prefix}.up_proj.weight", (inter, h), dtype),
                      (f"{prefix}.down_proj.weight", (h, inter), dtype)])

    for i, kind in enumerate(text["mlp_layer_types"]):
        p = f"model.layers.{i}"
        specs += [(f"{p}.input_layernorm.weight", (h,), dtype), (f"{p}.post_attention_layernorm.weight", (h,), dtype),
                  (f"{p}.self_attn.q_proj.weight", (q, h), dtype), (f"{p}.self_attn.k_proj.weight", (kv, h), dtype),
                  (f"{p}.self_attn.v_proj.weight", (kv, h), dtype), (f"{p}.self_attn.o_proj.weight", (h, q), dtype)]
        if kind == "dense":
            mlp(f"{p}.mlp", text["intermediate_size"])
            continue
        specs += [(f"{p}.mlp.gate.weight", (h, experts), "float32"), (f"{p}.mlp.gate.weight_1", (h, experts), "float32"),
                  (f"{p}.mlp.moe_statics.e_score_correction_bias", (2, experts), "float32")]
        for e in range(2 * experts):
            mlp(f"{p}.mlp.experts.{e}", inter_t if e < experts else inter_v)
        if text["moe_num_shared_experts"]:
            mlp(f"{p}.mlp.shared_experts", inter_t * text["moe_num_shared_experts"])
    specs.append(("model.norm.weight", (h,), dtype))
    if not text["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (text["vocab_size"], h), dtype))
    vp = "model.vision_model."
    patch = vision["in_channels"] * vision["patch_size"] ** 2
    specs.append((vp + "patch_embed.proj.weight", (v, patch), dtype))
    for b in range(vision["depth"]):
        bp = f"{vp}blocks.{b}."
        for name, shape in (("norm1", (v,)), ("norm2", (v,)), ("attn.qkv", (3 * v, v)), ("attn.proj", (v, v)),
                            ("mlp.fc1", (vision["intermediate_size"], v)), ("mlp.fc2", (v, vision["intermediate_size"]))):
            specs += [(f"{bp}{name}.weight", shape, dtype), (f"{bp}{name}.bias", (shape[0],), dtype)]
    specs += [(vp + "ln.weight", (v,), dtype), (vp + "ln.bias", (v,), dtype)]
    rp = "model.resampler_model."
    spatial = v * vision["spatial_merge_size"] ** 2
    for part, in_dim in (("spatial_linear", spatial), ("temporal_linear", spatial * vision["temporal_merge_size"])):
        for idx, shape in (("0", (spatial, in_dim)), ("2", (spatial, spatial)), ("3", (spatial,))):
            specs += [(f"{rp}{part}.{idx}.weight", shape, dtype), (f"{rp}{part}.{idx}.bias", (spatial,), dtype)]
    specs += [(rp + "mlp.weight", (h, spatial), dtype), (rp + "mlp.bias", (h,), dtype),
              (rp + "after_norm.weight", (h,), dtype)]
    return [TensorSpec(n, s, t, (n,), "copy") for n, s, t in specs]


def _to_paddle(specs: list[TensorSpec]) -> list[TensorSpec]:
    """PyTorch-naming specs -> the -Paddle release's names and ``[in, out]`` layouts."""
    shapes = {s.name: s.shape for s in specs}
    out: list[TensorSpec] = []
    for s in specs:
        name = s.name
        for old, new in (("model.vision_model.", "vision_model."), ("model.resampler_model.", "ernie.resampler_model."),
                         ("model.", "ernie.")):
            if name.startswith(old):
                name = new + name[len(old):]
                break
        if name.endswith((".k_proj.weight", ".v_proj.weight", ".up_proj.weight")):
            continue  # fused below
        fused = {".q_proj.weight": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                 ".gate_proj.weight": ("up_gate_proj", ("gate_proj", "up_proj"))}
        suffix = next((k for k in fused if name.endswith(k)), None)
        if suffix is not None:
            new_part, parts = fused[suffix]
            srcs = tuple(s.name.replace(parts[0], part) for part in parts)
            rows = sum(shapes[n][0] for n in srcs)
            out.append(TensorSpec(name.replace(parts[0], new_part), (s.shape[1], rows), s.dtype, srcs,
                                  "concat_transpose"))
        elif len(s.shape) == 2 and not name.endswith(("embed_tokens.weight", "correction_bias", "gate.weight",
                                                       "gate.weight_1")):
            out.append(TensorSpec(name, s.shape[::-1], s.dtype, (s.name,), "transpose"))
        else:
            out.append(TensorSpec(name, s.shape, s.dtype, (s.name,), "copy"))
    return out


def _value(name: str, shape: tuple[int, ...], text: dict[str, Any], seed: int) -> np.ndarray:
    """A PyTorch-naming tensor's fp32 values, from a generator seeded by (seed, name)."""
    lm = name.startswith("model.") and not name.startswith(("model.vision_model.", "model.resampler_model."))
    if lm and not name.endswith(("gate.weight", "gate.weight_1")):
        return _source_tensor(name, shape, {**text, "hidden_size": text["hidden_size"]}, seed)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    noise = rng.standard_normal(shape, dtype=np.float32)
    if len(shape) == 1:
        is_scale = name.endswith("weight")  # LayerNorm / RMSNorm scales
        return (1.0 + np.float32(0.05) * noise) if is_scale else np.float32(0.05) * noise
    fan_in = shape[0] if name.endswith(("gate.weight", "gate.weight_1")) else shape[1]
    return noise * np.float32(1.0 / math.sqrt(fan_in))


def system_font() -> Path | None:
    """The first of ``SYSTEM_FONTS`` on this machine, or None (the generator and the video tests use it)."""
    return next((Path(f) for f in SYSTEM_FONTS if Path(f).is_file()), None)


def _write_video_config(out: Path, vision: dict[str, Any], video: dict[str, Any]) -> None:
    """HF's ``Ernie4_5_VLMoeVideoProcessor`` keys (what it and ``VideoProcessorConfig.from_dir`` read),
    and the timestamp font next to them when the system has one."""
    font = system_font()
    if font is not None:
        shutil.copyfile(font, out / font.name)
    _write_json(out / "video_preprocessor_config.json", {
        "video_processor_type": "Ernie4_5_VLMoeVideoProcessor", "do_resize": True, "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": vision["patch_size"], "merge_size": vision["spatial_merge_size"],
        "temporal_patch_size": vision["temporal_merge_size"], "do_sample_frames": True,
        "min_frames": video["min_frames"], "max_frames": video["max_frames"], "draw_on_frames": True,
        "font": font.name if font is not None else "DejaVuSans.ttf",
        "size": {"shortest_edge": video["min_pixels"], "longest_edge": video["max_pixels"]},
    })


def _token_ids(out: Path) -> dict[str, int]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    return {key: int(sp.piece_to_id(piece)) for key, piece in _TOKENS.items()}


def generate_vl_checkpoint(path: str | Path, shape: str, naming: str = "pytorch", seed: int = 0,
                           dtype: str = "float32", shards: int = 1, **overrides: Any) -> Path:
    """Write a ``tiny-vl`` checkpoint to ``path`` (``overrides`` replace text config keys)."""
    if shape not in VL_SHAPES:
        raise ValueError(f"unknown ERNIE-4.5-VL checkpoint shape {shape!r}; expected one of {sorted(VL_SHAPES)}")
    if naming not in ("pytorch", "paddle"):
        raise ValueError(f"unknown naming {naming!r}; expected 'pytorch' or 'paddle'")
    if dtype not in _ST_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_ST_DTYPES)}")
    if shards != 1:
        raise ValueError(f"the VL generator writes one safetensors file; shards must be 1, got {shards}")
    base = VL_SHAPES[shape]
    text, vision = {**base["text"], **overrides}, dict(base["vision"])
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    sep_id = _write_tokenizer(out, text)
    ids = _token_ids(out)
    generated = {"seed": seed, "shape": shape, "naming": naming,
                 "note": "random weights generated by fd_core.testing.vl_checkpoint; not a trained model"}
    arch = "Ernie4_5_VLMoeForConditionalGeneration"
    if naming == "pytorch":
        config: dict[str, Any] = {"architectures": [arch], "model_type": "ernie4_5_vl_moe",
                                  "text_config": {**text, "model_type": "ernie4_5_vl_moe_text"},
                                  "vision_config": {**vision, "model_type": "ernie4_5_vl_moe_vision"},
                                  "tie_word_embeddings": text["tie_word_embeddings"], **ids}
    else:  # the releases' flat spelling
        flat = {k: v for k, v in text.items() if k not in ("mlp_layer_types", "rope_parameters")}
        rope = text["rope_parameters"]
        first_sparse = text["mlp_layer_types"].index("sparse")
        config = {"architectures": [arch], "model_type": "ernie4_5_moe_vl", **flat,
                  "moe_num_experts": [text["moe_num_experts"]] * 2, "rope_theta": rope["rope_theta"],
                  "freq_allocation": rope["mrope_section"][2], "moe_layer_start_index": first_sparse,
                  "moe_layer_end_index": text["num_hidden_layers"] - 1, "moe_layer_interval": 1,
                  "im_patch_id": ids["image_token_id"], "spatial_conv_size": vision["spatial_merge_size"],
                  "temporal_conv_size": vision["temporal_merge_size"], "use_rmsnorm": True,
                  "vision_config": {**vision, "embed_dim": vision["hidden_size"]}, **ids}
    config.update({"torch_dtype": dtype, "dtype": dtype, "fd_generated": generated})
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {"bos_token_id": text["bos_token_id"],
                                                 "pad_token_id": text["pad_token_id"],
                                                 "eos_token_id": [text["eos_token_id"], sep_id]})
    _write_json(out / "preprocessor_config.json", {
        "image_processor_type": "Ernie4_5_VLMoeImageProcessor", "do_resize": True, "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": vision["patch_size"], "merge_size": vision["spatial_merge_size"], "temporal_patch_size": 1,
        "size": {"shortest_edge": base["min_pixels"], "longest_edge": base["max_pixels"]},
    })
    _write_video_config(out, vision, base["video"])
    specs = vl_tensor_specs(text, vision, dtype)
    shapes_of = {s.name: s.shape for s in specs}
    if naming == "paddle":
        specs = _to_paddle(specs)

    def make(spec: TensorSpec) -> np.ndarray:
        return _build(spec, lambda n: _value(n, shapes_of[n], text, seed))

    _write_safetensors(out / "model.safetensors", specs, make, "pt" if naming == "pytorch" else "np")
    return out

