"""Generated ERNIE 4.5 checkpoints: real configs and on-disk formats, seeded random weights.

Real weights cannot be downloaded here, so tests and benchmarks use these.
`generate_checkpoint` writes config.json (marked `fd_generated`),
generation_config.json, a sentencepiece tokenizer trained on local text with
ERNIE's special tokens and chat template, and safetensors weights in either
naming:

- "pytorch": the tensor names and [out, in] layouts of baidu/ERNIE-4.5-*-PT,
  which HF transformers loads as Ernie4_5(_Moe)ForCausalLM;
- "paddle": baidu/ERNIE-4.5-*-Paddle: prefix `ernie.`, [in, out] layouts,
  fused `qkv_proj` = [q | k | v] and `up_gate_proj` = [gate | up] on the
  output axis, router `mlp.gate.weight` as [hidden, experts].

Every tensor is drawn from its own generator seeded by (seed, PyTorch name),
so output is byte-identical for a seed, and a paddle checkpoint holds exactly
the same model as the pytorch one of the same seed and shape. Tensors are
generated and written one at a time (bounded memory). Also a command line:
`python -m fd_core.testing.checkpoints --shape tiny-moe --naming paddle --out DIR`.
"""

from __future__ import annotations

import argparse
import json
import math
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "SHAPES",
    "TensorSpec",
    "generate_checkpoint",
    "generate_ernie_checkpoint",
    "main",
    "pytorch_tensor_specs",
    "pytorch_to_paddle_names",
]

_DATA = Path(__file__).parent / "data"
_TOKENIZER_PIECES = 2048  # trained tokenizer size: the tiny shapes' vocab_size

# fmt: off
_COMMON: dict[str, Any] = {
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "hidden_act": "silu",
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True,
    "use_bias": False, "use_cache": True,
}
_TINY: dict[str, Any] = {
    **_COMMON, "model_type": "ernie4_5", "vocab_size": _TOKENIZER_PIECES, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2048,
}
SHAPES: dict[str, dict[str, Any]] = {  # config.json keys, as ERNIE-4.5-0.3B / -21B-A3B spell them
    "tiny-dense": _TINY,
    "tiny-moe": {
        **_TINY, "model_type": "ernie4_5_moe", "num_hidden_layers": 3,
        "moe_num_experts": 8, "moe_k": 2, "moe_num_shared_experts": 1, "moe_intermediate_size": 32,
        "moe_layer_start_index": 1, "moe_layer_end_index": 2, "moe_layer_interval": 1,
        "moe_capacity": [8, 8, 8], "moe_gate": "topk", "moe_use_aux_free": True,
        "moe_norm_min": 1e-12,
    },
    "0.3b": {
        **_COMMON, "model_type": "ernie4_5", "vocab_size": 103424, "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 128, "max_position_embeddings": 131072,
    },
    # baidu/ERNIE-4.5-21B-A3B-PT (transformers' Ernie4_5_MoeConfig defaults): 42 GB of bf16;
    # generate it with fd_core.testing.streamed_checkpoints (benchmarks/real_size.py)
    "21b-a3b": {
        **_COMMON, "model_type": "ernie4_5_moe", "vocab_size": 103424, "hidden_size": 2560,
        "intermediate_size": 12288, "num_hidden_layers": 28, "num_attention_heads": 20,
        "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 131072,
        "moe_num_experts": 64, "moe_k": 6, "moe_num_shared_experts": 2, "moe_intermediate_size": 1536,
        "moe_layer_start_index": 1, "moe_layer_end_index": 27, "moe_layer_interval": 1,
        "moe_capacity": [64, 64, 64], "moe_gate": "topk", "moe_use_aux_free": True, "moe_norm_min": 1e-12,
    },
}
_ARCHITECTURES = {  # (model_type, naming) -> architectures, as the real releases spell them
    ("ernie4_5", "pytorch"): "Ernie4_5ForCausalLM",
    ("ernie4_5", "paddle"): "Ernie4_5_ForCausalLM",
    ("ernie4_5_moe", "pytorch"): "Ernie4_5_MoeForCausalLM",
    ("ernie4_5_moe", "paddle"): "Ernie4_5_MoeForCausalLM",
}
# fmt: on
_RESIDUAL_GAIN = 10.0  # o_proj / down_proj gain times sqrt(layers): see _source_tensor
_ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


class TensorSpec(NamedTuple):
    """One stored tensor: name, shape, dtype ("bfloat16"/"float32") and how to build it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    sources: tuple[str, ...]  # PyTorch-naming tensors it is made from
    # "copy" | "transpose" | "concat_transpose" (concat [out, in] on the out axis, then transpose)
    transform: str


def _is_moe_layer(cfg: dict[str, Any], i: int) -> bool:
    if cfg["model_type"] != "ernie4_5_moe":
        return False
    end = cfg.get("moe_layer_end_index", -1)
    end = cfg["num_hidden_layers"] - 1 if end == -1 else end
    return (i + 1) % cfg["moe_layer_interval"] == 0 and cfg["moe_layer_start_index"] <= i <= end


def pytorch_tensor_specs(cfg: dict[str, Any], dtype: str = "bfloat16") -> list[TensorSpec]:
    """The tensors of a PyTorch-naming (ERNIE-4.5-*-PT) checkpoint for `cfg`, [out, in] layouts."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    specs: list[tuple[str, tuple[int, ...], str]] = [
        ("model.embed_tokens.weight", (cfg["vocab_size"], h), dtype)
    ]

    def mlp(prefix: str, inter: int) -> None:
        for proj, shape in (
            ("gate_proj", (inter, h)),
            ("up_proj", (inter, h)),
            ("down_proj", (h, inter)),
        ):
            specs.append((f"{prefix}.{proj}.weight", shape, dtype))

    def layer(p: str, moe: bool) -> None:
        specs.extend([
            (f"{p}.input_layernorm.weight", (h,), dtype),
            (f"{p}.post_attention_layernorm.weight", (h,), dtype),
            (f"{p}.self_attn.q_proj.weight", (q, h), dtype),
            (f"{p}.self_attn.k_proj.weight", (kv, h), dtype),
            (f"{p}.self_attn.v_proj.weight", (kv, h), dtype),
            (f"{p}.self_attn.o_proj.weight", (h, q), dtype),
        ])
        if moe:
            experts, inter = cfg["moe_num_experts"], cfg["moe_intermediate_size"]
            specs.extend([
                (f"{p}.mlp.gate.weight", (experts, h), "float32"),  # router: fp32, as HF keeps it
                (f"{p}.mlp.moe_statics.e_score_correction_bias", (1, experts), "float32"),
            ])
            for e in range(experts):
                mlp(f"{p}.mlp.experts.{e}", inter)
            if cfg["moe_num_shared_experts"] > 0:
                mlp(f"{p}.mlp.shared_experts", inter * cfg["moe_num_shared_experts"])
        else:
            mlp(f"{p}.mlp", cfg["intermediate_size"])

    for i in range(cfg["num_hidden_layers"]):
        layer(f"model.layers.{i}", _is_moe_layer(cfg, i))
    specs.append(("model.norm.weight", (h,), dtype))
    # ERNIE's MTP block(s) (num_nextn_predict_layers; fd_core.models.ernie4_5_mtp): the MoE
    # checkpoints' block has routed experts, as FastDeploy's MoE decoder layer class builds it
    for i in range(cfg.get("num_nextn_predict_layers", 0)):
        specs += [(f"model.mtp_emb_norm.{i}.weight", (h,), dtype), (f"model.mtp_hidden_norm.{i}.weight", (h,), dtype),
                  (f"model.mtp_linear_proj.{i}.weight", (h, 2 * h), dtype)]
        layer(f"model.mtp_block.{i}", cfg["model_type"] == "ernie4_5_moe")
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (cfg["vocab_size"], h), dtype))
    return [TensorSpec(n, s, t, (n,), "copy") for n, s, t in specs]


def pytorch_to_paddle_names(specs: Sequence[TensorSpec]) -> list[TensorSpec]:
    """Map PyTorch-naming specs to the Paddle naming: `ernie.` prefix, [in, out], fused qkv / up_gate."""
    shapes = {s.name: s.shape for s in specs}
    out: list[TensorSpec] = []
    for s in specs:
        name = s.name.replace("model.", "ernie.", 1) if s.name.startswith("model.") else s.name
        if name.endswith((".k_proj.weight", ".v_proj.weight", ".up_proj.weight")):
            continue  # fused into qkv_proj / up_gate_proj below
        fused = {".q_proj.weight": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                 ".gate_proj.weight": ("up_gate_proj", ("gate_proj", "up_proj"))}  # fmt: skip
        suffix = next((k for k in fused if name.endswith(k)), None)
        if suffix is not None:
            new_part, parts = fused[suffix]
            old_part = parts[0]
            srcs = tuple(s.name.replace(old_part, part) for part in parts)
            rows = sum(shapes[n][0] for n in srcs)  # [q | k | v] or [gate | up] on the out axis
            new_name = name.replace(old_part, new_part)
            out.append(TensorSpec(new_name, (s.shape[1], rows), s.dtype, srcs, "concat_transpose"))
        elif len(s.shape) == 2 and not name.endswith(("embed_tokens.weight", "correction_bias")):
            out.append(TensorSpec(name, s.shape[::-1], s.dtype, (s.name,), "transpose"))
        else:
            out.append(TensorSpec(name, s.shape, s.dtype, (s.name,), "copy"))
    return out


_REAL_TOKEN_FLAG = 5.0  # see _source_tensor: keeps padding rows out of the outputs


def _source_tensor(name: str, shape: tuple[int, ...], cfg: dict[str, Any], seed: int) -> np.ndarray:
    """A PyTorch-naming tensor's fp32 values, from a generator seeded by (seed, name).

    Scales keep a random model lively (varied greedy outputs, not a copy of the
    last token): projections have gain 1 (std 1/sqrt(fan_in)), o_proj/down_proj
    gain _RESIDUAL_GAIN/sqrt(layers) so the layers outweigh the input embedding
    in the residual stream; tied embeddings give logits of std ~2.5; norms ~1;
    e_score_correction_bias ~ the gaps between routing probabilities, so it
    changes which experts are picked.
    """
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("norm.weight") or ".mtp_emb_norm." in name or ".mtp_hidden_norm." in name:
        return 1.0 + np.float32(0.05) * rng.standard_normal(shape, dtype=np.float32)
    if name.endswith("e_score_correction_bias"):
        return np.float32(0.05) * rng.standard_normal(shape, dtype=np.float32)
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        std = 2.5 / math.sqrt(cfg["hidden_size"])
        values = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        if shape[0] > _TOKENIZER_PIECES:
            # rows past the trained pieces are the tokenizer's <unused_N> padding.
            # A trained model never emits them; here one hidden dimension flags
            # "real token": +c for real rows, -c for padding rows, so the (tied)
            # logits of padding rows sit far below those of real ones.
            values[_TOKENIZER_PIECES:] *= np.float32(0.02)
            values[:_TOKENIZER_PIECES, 0] = np.float32(_REAL_TOKEN_FLAG)
            values[_TOKENIZER_PIECES:, 0] = -np.float32(_REAL_TOKEN_FLAG)
        return values
    else:
        std = 1.0 / math.sqrt(shape[1])
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            std *= _RESIDUAL_GAIN / math.sqrt(cfg["num_hidden_layers"])
    values = rng.standard_normal(shape, dtype=np.float32)
    values *= np.float32(std)
    return values


def _build(spec: TensorSpec, source: Callable[[str], np.ndarray]) -> np.ndarray:
    arrays = [source(n) for n in spec.sources]
    if spec.transform == "copy":
        return arrays[0]
    if spec.transform == "transpose":
        return np.ascontiguousarray(arrays[0].T)
    return np.ascontiguousarray(np.concatenate(arrays, axis=0).T)


def _write_array(f: Any, values: np.ndarray, dtype: str, chunk: int = 1 << 22) -> None:
    """Write `values` as little-endian fp32, fp16 or bf16 (round to nearest even), `chunk` elements at a time."""
    flat = values.reshape(-1)
    for start in range(0, flat.size, chunk):
        part = flat[start : start + chunk].astype(np.float32, copy=False)
        if dtype in ("float32", "float16"):
            f.write(part.astype("<f4" if dtype == "float32" else "<f2").tobytes())
            continue
        bits = part.view(np.uint32)
        rounded = (
            bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        ) >> np.uint32(16)
        f.write(rounded.astype("<u2").tobytes())


def _nbytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * (4 if spec.dtype == "float32" else 2)


def _write_safetensors(
    path: Path, specs: Sequence[TensorSpec], make: Callable[[TensorSpec], np.ndarray], fmt: str
) -> None:
    """Stream tensors into one safetensors file (header first; then data, one tensor at a time)."""
    header: dict[str, Any] = {"__metadata__": {"format": fmt}}
    offset = 0
    for s in specs:
        header[s.name] = {
            "dtype": _ST_DTYPES[s.dtype],
            "shape": list(s.shape),
            "data_offsets": [offset, offset + _nbytes(s)],
        }
        offset += _nbytes(s)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for s in specs:
            _write_array(f, make(s), s.dtype)


def _split(specs: Sequence[TensorSpec], shards: int) -> list[list[TensorSpec]]:
    total = sum(_nbytes(s) for s in specs)
    groups: list[list[TensorSpec]] = [[] for _ in range(shards)]
    done = 0
    for s in specs:  # contiguous split, roughly equal bytes
        groups[min(shards - 1, done * shards // max(total, 1))].append(s)
        done += _nbytes(s)
    return groups


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_tokenizer(out: Path, cfg: dict[str, Any]) -> int:
    """Write the tokenizer files; returns the id of <|end_of_sentence|>."""
    import sentencepiece as spm

    from fd_core.tokenizer.special_tokens import SEP_TOKEN
    from fd_core.tokenizer.spm_builder import pad_model, train_model, write_tokenizer_files

    corpus = [p.read_text(encoding="utf-8") for p in sorted(_DATA.glob("*.txt"))]
    model = train_model(corpus, _TOKENIZER_PIECES)
    if cfg["vocab_size"] < _TOKENIZER_PIECES:
        raise ValueError(
            f"vocab_size {cfg['vocab_size']} is smaller than the generated tokenizer "
            f"({_TOKENIZER_PIECES} pieces); use vocab_size >= {_TOKENIZER_PIECES}"
        )
    write_tokenizer_files(
        out, pad_model(model, cfg["vocab_size"]), model_max_length=cfg["max_position_embeddings"]
    )
    return int(spm.SentencePieceProcessor(model_proto=model).piece_to_id(SEP_TOKEN))


def generate_checkpoint(
    path: str | Path,
    shape: str,
    naming: str = "pytorch",
    seed: int = 0,
    dtype: str = "bfloat16",
    shards: int = 1,
    **overrides: Any,
) -> Path:
    """Write a random-weight checkpoint of `shape` to `path`; returns the directory.

    `shape` is any registered generator's (``fd_core.testing.generators``:
    ERNIE 4.5's SHAPES, Qwen3's, a model plugin's). `naming` is "pytorch" or
    "paddle"; `overrides` replace config keys (e.g. num_hidden_layers=1).
    With `shards` > 1 the weights go into model-0000i-of-0000N.safetensors
    files plus model.safetensors.index.json.
    """
    from fd_core.testing.generators import generators

    return generators.generate(path, shape, naming=naming, seed=seed, dtype=dtype, shards=shards, **overrides)


def generate_ernie_checkpoint(
    path: str | Path,
    shape: str,
    naming: str = "pytorch",
    seed: int = 0,
    dtype: str = "bfloat16",
    shards: int = 1,
    **overrides: Any,
) -> Path:
    """The ERNIE 4.5 generator (see SHAPES and the module doc)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown ERNIE 4.5 checkpoint shape {shape!r}; expected one of {sorted(SHAPES)}")
    if naming not in ("pytorch", "paddle"):
        raise ValueError(f"unknown naming {naming!r}; expected 'pytorch' or 'paddle'")
    if dtype not in _ST_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_ST_DTYPES)}")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    cfg = {**SHAPES[shape], **overrides}
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    # <|end_of_sentence|> ends every assistant turn, so it is an eos for chat too
    sep_id = _write_tokenizer(out, cfg)
    specs = pytorch_tensor_specs(cfg, dtype)
    if naming == "paddle":
        specs = pytorch_to_paddle_names(specs)
    config = {
        "architectures": [_ARCHITECTURES[cfg["model_type"], naming]],
        **cfg,
        "torch_dtype": dtype,
        "dtype": dtype,
        "fd_generated": {
            "seed": seed,
            "shape": shape,
            "naming": naming,
            "note": "random weights generated by fd_core.testing.checkpoints; not a trained model",
        },
    }
    if naming == "paddle":
        config["use_rmsnorm"] = True
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json",
        {
            "bos_token_id": cfg["bos_token_id"],
            "pad_token_id": cfg["pad_token_id"],
            "eos_token_id": [cfg["eos_token_id"], sep_id],
        },
    )

    shapes_of = {s.name: s.shape for s in pytorch_tensor_specs(cfg, dtype)}

    def make(spec: TensorSpec) -> np.ndarray:
        return _build(spec, lambda n: _source_tensor(n, shapes_of[n], cfg, seed))

    fmt = "pt" if naming == "pytorch" else "np"
    if shards == 1:
        _write_safetensors(out / "model.safetensors", specs, make, fmt)
        return out
    weight_map: dict[str, str] = {}
    for i, group in enumerate(_split(specs, shards)):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        _write_safetensors(out / fname, group, make, fmt)
        weight_map.update({s.name: fname for s in group})
    _write_json(
        out / "model.safetensors.index.json",
        {"metadata": {"total_size": sum(_nbytes(s) for s in specs)}, "weight_map": weight_map},
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: generate one checkpoint into --out."""
    parser = argparse.ArgumentParser(
        prog="python -m fd_core.testing.checkpoints", description=__doc__.split("\n")[0]
    )
    from fd_core.testing.generators import generators

    parser.add_argument("--shape", required=True, choices=generators.shapes(),
                        help="a registered generator's shape (model plugins add theirs)")
    parser.add_argument("--naming", default="pytorch", choices=["pytorch", "paddle"])
    parser.add_argument("--out", required=True, help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_ST_DTYPES))
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--mtp", action="store_true",
                        help="add ERNIE's MTP block (num_nextn_predict_layers: 1) for --speculative-config mtp")
    args = parser.parse_args(argv)
    extra = {"num_nextn_predict_layers": 1} if args.mtp else {}
    out = generate_checkpoint(args.out, args.shape, args.naming, args.seed, args.dtype, args.shards, **extra)
    print(f"wrote {args.shape} ({args.naming} naming, seed {args.seed}, {args.dtype}) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
