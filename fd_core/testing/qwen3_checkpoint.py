"""Generated Qwen3 (dense) checkpoints: HF's on-disk format, seeded random weights.

`generate_qwen3_checkpoint` writes what a Qwen/Qwen3-* release ships:
config.json (``Qwen3ForCausalLM``, marked ``fd_generated``),
generation_config.json, model.safetensors in HF's PyTorch naming (linear
weights ``[out, in]``, ``self_attn.q_norm`` / ``k_norm`` of ``[head_dim]``),
and a byte-level BPE tokenizer.json trained on local text with the
``tokenizers`` library, configured as Qwen's (NFC, Qwen's split regex,
byte-level), its added tokens (``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>``, ``<think>``, ...) after the BPE vocabulary, and
tokenizer_config.json holding Qwen3's chat template. Weights are drawn as
`fd_core.testing.checkpoints` draws ERNIE's (per-tensor seeded generators).
`python -m fd_core.testing.checkpoints --shape tiny-qwen3 --out DIR` reaches it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from fd_core.testing.checkpoints import (
    _DATA,
    _ST_DTYPES,
    _TOKENIZER_PIECES,
    TensorSpec,
    _source_tensor,
    _write_json,
    _write_safetensors,
)

__all__ = ["QWEN3_SHAPES", "generate_qwen3_checkpoint", "qwen3_tensor_specs"]

# Qwen2/Qwen3's pre-tokenizer split, verbatim from their tokenizer.json
_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
# Qwen3's added tokens in their release order (content, special); <think> and the tool tags are not special
_ADDED = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|image_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)
CHAT_TEMPLATE_FILE = _DATA / "qwen3_chat_template.jinja"

# fmt: off
_TINY: dict[str, Any] = {  # Qwen3-0.6B's keys; head_dim 32 != hidden / heads, as in the real models
    "model_type": "qwen3", "vocab_size": _TOKENIZER_PIECES, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2, "rope_scaling": None,
    "use_cache": True, "initializer_range": 0.02,
}
QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "tiny-qwen3": _TINY,
    "qwen3-0.6b": {
        **_TINY, "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "tie_word_embeddings": True, "max_window_layers": 28,
    },
}
# fmt: on


def qwen3_tensor_specs(cfg: dict[str, Any], dtype: str = "bfloat16") -> list[TensorSpec]:
    """The tensors of a Qwen3 checkpoint for `cfg` (HF names, [out, in] layouts)."""
    h, d, inter = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    specs: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        specs += [
            (f"{p}.input_layernorm.weight", (h,)), (f"{p}.post_attention_layernorm.weight", (h,)),
            (f"{p}.self_attn.q_proj.weight", (q, h)), (f"{p}.self_attn.k_proj.weight", (kv, h)),
            (f"{p}.self_attn.v_proj.weight", (kv, h)), (f"{p}.self_attn.o_proj.weight", (h, q)),
            (f"{p}.self_attn.q_norm.weight", (d,)), (f"{p}.self_attn.k_norm.weight", (d,)),
            (f"{p}.mlp.gate_proj.weight", (inter, h)), (f"{p}.mlp.up_proj.weight", (inter, h)),
            (f"{p}.mlp.down_proj.weight", (h, inter)),
        ]
    specs.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (cfg["vocab_size"], h)))
    return [TensorSpec(n, s, dtype, (n,), "copy") for n, s in specs]


@functools.lru_cache(maxsize=2)
def train_tokenizer(size: int = _TOKENIZER_PIECES) -> str:
    """tokenizer.json text: byte-level BPE of `size` ids in all, the added tokens last (as Qwen's)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=size - len(_ADDED), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [line for p in sorted(_DATA.glob("*.txt")) for line in p.read_text(encoding="utf-8").splitlines(True)]
    tok.train_from_iterator(corpus, trainer)
    if tok.get_vocab_size() != size - len(_ADDED):
        raise RuntimeError(f"the BPE trained to {tok.get_vocab_size()} tokens, expected {size - len(_ADDED)}")
    for content, special in _ADDED:  # one at a time: ids follow the list
        token = AddedToken(content, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
    return str(tok.to_str())


def _write_tokenizer(out: Path, cfg: dict[str, Any]) -> dict[str, int]:
    """Write tokenizer.json and tokenizer_config.json; returns the added tokens' ids."""
    import json

    text = train_tokenizer()
    (out / "tokenizer.json").write_text(text, encoding="utf-8")
    added = {t["content"]: int(t["id"]) for t in json.loads(text)["added_tokens"]}
    special = dict(_ADDED)
    _write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": special[c]} for c, i in added.items()},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None, "chat_template": CHAT_TEMPLATE_FILE.read_text(encoding="utf-8"),
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": cfg["max_position_embeddings"], "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    })
    return added


def generate_qwen3_checkpoint(
    path: str | Path, shape: str = "tiny-qwen3", naming: str = "pytorch", seed: int = 0, dtype: str = "bfloat16",
    shards: int = 1, **overrides: Any,
) -> Path:
    """Write a random-weight Qwen3 checkpoint of `shape` (see QWEN3_SHAPES) to `path`; returns the directory.

    `overrides` replace config keys (e.g. tie_word_embeddings=True). The
    tokenizer has 2048 ids; a larger vocab_size pads the embedding (rows a
    trained model never emits, kept out of greedy outputs as the ERNIE generator does)."""
    if shape not in QWEN3_SHAPES:
        raise ValueError(f"unknown Qwen3 checkpoint shape {shape!r}; expected one of {sorted(QWEN3_SHAPES)}")
    if naming != "pytorch" or shards != 1:
        raise ValueError(f"Qwen3 checkpoints are generated in HF's PyTorch naming as one file; got naming "
                         f"{naming!r}, shards {shards} (expected 'pytorch', 1)")
    if dtype not in _ST_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_ST_DTYPES)}")
    cfg = {**QWEN3_SHAPES[shape], **overrides}
    if cfg["vocab_size"] < _TOKENIZER_PIECES:
        raise ValueError(f"vocab_size {cfg['vocab_size']} is smaller than the generated tokenizer "
                         f"({_TOKENIZER_PIECES} ids); use vocab_size >= {_TOKENIZER_PIECES}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    added = _write_tokenizer(out, cfg)
    end, im_end = added["<|endoftext|>"], added["<|im_end|>"]
    _write_json(out / "config.json", {
        "architectures": ["Qwen3ForCausalLM"], **cfg, "bos_token_id": end, "eos_token_id": im_end,
        "torch_dtype": dtype, "dtype": dtype,
        "fd_generated": {"seed": seed, "shape": shape, "naming": "pytorch",
                         "note": "random weights generated by fd_core.testing.qwen3_checkpoint; not a trained model"},
    })
    _write_json(out / "generation_config.json", {
        "bos_token_id": end, "eos_token_id": [im_end, end], "pad_token_id": end,
        "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
    })
    specs = qwen3_tensor_specs(cfg, dtype)

    def make(spec: TensorSpec) -> np.ndarray:
        return _source_tensor(spec.name, spec.shape, cfg, seed)

    _write_safetensors(out / "model.safetensors", specs, make, "pt")
    return out
