"""Who is right on ERNIE-4.5-21B-A3B: fd-core, llama.cpp or HF transformers, in fp32 on a reduced shape.

    python benchmarks/moe_oracle.py                    # reduced 21B-A3B-like MoE, 3 prompts x 8 greedy tokens
    python benchmarks/moe_oracle.py --streamed         # the same shape drawn by streamed_checkpoints (as real_size.py)
    python benchmarks/moe_oracle.py --no-llama-cpp     # fd-core against transformers only

A benchmark-side check, never CI (the CI test against transformers is
tests/models/test_ernie_moe_21b_like.py). One run:

1. A checkpoint with every feature of ``SHAPES["21b-a3b"]`` (config keys as
   the real release spells them: ``moe_layer_start_index``, ``moe_k`` 6 of 64
   experts, 2 shared experts, ``moe_statics.e_score_correction_bias``, tied
   embeddings, vocab 103424, rope theta 500000, GQA 4 KV heads) but 3 layers
   (1 dense + 2 MoE) and small widths, PyTorch naming, bf16 values held fp32.
   The dense width keeps the real ratio ``intermediate_size //
   num_key_value_heads == moe_intermediate_size * moe_num_shared_experts``
   so llama.cpp's converter needs no metadata fix.
2. HF transformers (the oracle) in fp32, fd-core fp32 on the CPU reference
   backend and on x86, llama.cpp f32 (its own converter, llama-server):
   greedy tokens after each token-id prompt, and for the first token the
   top-5 ids with fp32 logits (transformers and fd-core) so a flat top can be
   told from a real difference.
3. Prints the tokens, which side agrees with transformers, and how many ids
   are padding rows (>= 2048, past the generated tokenizer's pieces). A scan
   of transformers over 8 x 64 random ids says where padding rows win: the
   generator flags real rows +5 and padding rows -5 in dimension 0 of the
   tied table, so they win wherever the final normed hidden state's
   dimension 0 is negative enough, in any implementation.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# every 21B-A3B feature at small widths (see the module doc)
REDUCED_21B: dict[str, Any] = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 32, "moe_intermediate_size": 64, "moe_layer_end_index": 2,
    "max_position_embeddings": 4096,
}
PROMPTS = [[1895, 1287, 1399, 1804, 1198, 1573, 1683, 527, 205, 670, 641, 1759, 1833, 110, 1049, 1660],
           [349, 1614, 326, 989, 1651, 675, 749, 629, 1466, 584, 1981, 945, 1008, 1058, 1206, 1151],
           [1, 100, 200, 300]]


PIECES = 2048  # the generated tokenizer's trained pieces; rows past it are <unused_N> padding


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", type=Path, default=ROOT / "checkpoints" / "moe-oracle")
    p.add_argument("--streamed", action="store_true", help="values from streamed_checkpoints (real_size.py's)")
    p.add_argument("--layers", type=int, default=3, help="layers: 1 dense + the rest MoE, as the 21B")
    p.add_argument("--wide", action="store_true",
                   help="the real attention and dense widths (hidden 2560, 20 x 128 heads, 4 KV, dense 12288), "
                        "experts 64 wide: ~2 GB of fp32")
    p.add_argument("--quantized", action="store_true",
                   help="also fd-core x86 wint4 (dtype auto, as real_size.py) and llama.cpp q4_0")
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-llama-cpp", action="store_true")
    p.add_argument("--backends", default="cpu,x86", help="fd-core backends, comma separated")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def generate(args: argparse.Namespace) -> Path:
    """The reduced checkpoint (reused when there)."""
    shape = {**REDUCED_21B, "num_hidden_layers": args.layers, "moe_layer_end_index": args.layers - 1}
    if args.wide:
        shape.update(hidden_size=2560, intermediate_size=12288, num_attention_heads=20, head_dim=128)
    tag = f"{args.layers}{'-wide' if args.wide else ''}"
    if args.streamed:
        from fd_core.testing.streamed_checkpoints import generate_streamed_checkpoint

        return generate_streamed_checkpoint(args.work_dir / f"streamed-{tag}", "21b-a3b", 0, **shape)
    from fd_core.testing.checkpoints import generate_checkpoint

    out = args.work_dir / f"plain-{tag}"
    if not (out / "model.safetensors").is_file():
        generate_checkpoint(out, "21b-a3b", "pytorch", 0, "bfloat16", **shape)
    return out


def hf_side(checkpoint: Path, tokens: int) -> dict[str, Any]:
    """Greedy tokens and first-token top-5 from transformers in fp32."""
    import torch

    # a torchvision that does not match torch breaks transformers' model imports; the text model needs none
    sys.modules.setdefault("torchvision", None)  # type: ignore[arg-type]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    greedy, top = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            logits = model(ids).logits[0, -1]
            values, index = torch.topk(logits, 5)
            top.append([(int(i), round(float(v), 4)) for i, v in zip(index, values, strict=True)])
            out = model.generate(ids, max_new_tokens=tokens, do_sample=False, min_new_tokens=tokens)
            greedy.append([int(t) for t in out[0, len(prompt):]])
        # where padding rows win: the final normed hidden state's dimension 0 (the generator's flag) < 0
        ids = torch.tensor(np.random.default_rng(0).integers(3, PIECES, (8, 64)))
        scan = model(ids, output_hidden_states=True)
        h0, pad = scan.hidden_states[-1][..., 0], scan.logits.argmax(-1) >= PIECES
        padding = {"positions": int(pad.numel()), "argmax_padding": int(pad.sum()),
                   "padding_where_h0_negative": int((pad & (h0 < 0)).sum()), "h0_mean": round(float(h0.mean()), 3),
                   "h0_std": round(float(h0.std()), 3)}
    return {"greedy": greedy, "top5": top, "padding_scan": padding}


def fd_side(checkpoint: Path, backend: str, tokens: int, **engine: Any) -> dict[str, Any]:
    """Greedy tokens and first-token top-5 (logprobs) from fd-core on ``backend`` (fp32 unless ``engine``)."""
    from fd_core import LLM, SamplingParams

    engine = engine or {"dtype": "float32"}
    llm = LLM(str(checkpoint), backend=backend, max_model_len=256, max_num_seqs=4, **engine)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    greedy = [list(map(int, o.outputs[0].token_ids)) for o in outs]
    top = []
    for o in outs:
        first = o.outputs[0].logprobs[0] if o.outputs[0].logprobs else {}
        top.append(sorted(((int(t), round(float(getattr(lp, "logprob", lp)), 4)) for t, lp in first.items()),
                          key=lambda x: -x[1])[:5])
    del llm
    return {"greedy": greedy, "top5": top}


def llama_side(checkpoint: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Greedy tokens from llama.cpp f32 converted by its own converter."""
    import llama_cpp_build as build
    import llama_cpp_runs as runs

    llama = build.find_or_build()
    gguf = build.convert(llama, checkpoint, checkpoint.parent / f"{checkpoint.name}-f32.gguf", "f32")
    greedy = runs.greedy_tokens(llama, gguf, PROMPTS, args.tokens, args.threads,
                                gguf.with_suffix(".server.log"))
    out = {"greedy": greedy, "gguf": str(gguf), "commit": llama.commit()}
    if args.quantized:
        q4 = build.quantize(llama, gguf, "q4_0", args.threads)
        out["q4_0"] = runs.greedy_tokens(llama, q4, PROMPTS, args.tokens, args.threads, q4.with_suffix(".server.log"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import os

    os.environ.setdefault("FD_CPU_NUM_THREADS", str(args.threads))
    checkpoint = generate(args)
    sides: dict[str, dict[str, Any]] = {"transformers fp32": hf_side(checkpoint, args.tokens)}
    for backend in args.backends.split(","):
        sides[f"fd-core {backend} fp32"] = fd_side(checkpoint, backend, args.tokens)
    if args.quantized:
        sides["fd-core x86 wint4"] = fd_side(checkpoint, "x86", args.tokens, quantization="wint4")
    if not args.no_llama_cpp:
        sides["llama.cpp f32"] = llama_side(checkpoint, args)
        if args.quantized:
            sides["llama.cpp q4_0"] = {"greedy": sides["llama.cpp f32"].pop("q4_0")}
    oracle = sides["transformers fp32"]["greedy"]
    print(f"checkpoint {checkpoint} ({'streamed' if args.streamed else 'checkpoints'} values)")
    print(f"transformers fp32 over 8 x 64 random ids: {sides['transformers fp32']['padding_scan']}")
    for name, side in sides.items():
        same = sum(a == b for a, b in zip(side["greedy"], oracle, strict=True))
        pad = sum(t >= PIECES for toks in side["greedy"] for t in toks)
        print(f"{name:22s} = transformers on {same}/{len(oracle)} prompts; {pad} padding-row ids (>= {PIECES})")
        for prompt_tokens, top in zip(side["greedy"], side.get("top5", [None] * len(oracle)), strict=True):
            print(f"    {prompt_tokens}" + (f"  top5 {top}" if top else ""))
    if args.json:
        args.json.write_text(json.dumps(sides, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
