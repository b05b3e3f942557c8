"""How far each quantization method moves a model from its fp32 self.

For each shape and method, on the CPU reference backend (the numerics every
backend is held to), over ``--prompts`` random prompts of 8 to 24 tokens:

- greedy agreement: both models greedy-decode ``--tokens`` tokens;
  ``prefix`` is the mean fraction of positions equal before the first
  divergence, ``identical`` the fraction of sequences equal throughout;
- teacher-forced: the quantized model reads prompt + the fp32 model's greedy
  tokens in one prefill; ``top1`` is the fraction of positions where its
  argmax is the fp32 token, ``|dlogprob|`` the mean and max absolute
  difference of the fp32 token's log-probability between the two models;
- weights: resident weight bytes, fp32 and quantized.

    python benchmarks/quant_agreement.py                         # tiny-dense, tiny-moe
    python benchmarks/quant_agreement.py --shapes 0.3b --prompts 32 --tokens 32
    python benchmarks/quant_agreement.py --json                  # one JSON object per line

Methods: wint8, wint4 (on ERNIE: dense layers wint8, routed experts wint4,
as FastDeploy does), w8a8, ``wint4-all`` (FastDeploy's mix_quant form
with wint4 dense layers too), and ``wint8-qh`` / ``w8a8-qh``: the same with
the LM head quantized too (opt-in ``lm_head_quant_type``: wint8, w8a8; by
default the head stays float, as in FastDeploy).

Issue 22's methods (not in the default list; name them with ``--methods``):
``block_wise_fp8``, ``w4a8``, ``w4afp8`` (every linear and the experts),
``w4a8-moe`` and ``w4afp8-moe`` (FastDeploy's split: dense wint8, routed
experts w4a8 / w4afp8).
``--shapes mid-moe`` is ``benchmarks/moe_decode.py``'s mid-size MoE
(hidden 1024, 16 experts, top-4; generated with its overrides).

    python benchmarks/quant_agreement.py --shapes 0.3b mid-moe --methods wint8 block_wise_fp8 w4a8 w4a8-moe

FastDeploy's offline-quantized checkpoint formats (``offline-fp8``,
``offline-w4a8c8``, ``offline-2bits``): the shape's float checkpoint written
in that on-disk layout by ``fd_core.testing.quantized_checkpoints`` (once,
beside it) and loaded as stored, detected from its config.json (no
``--quantization``); W4A8C8 runs with the int8 KV cache its config asks for,
its static per-channel scales applied (``int8_static``). To see what the KV
cache costs, ``offline-w4a8c8-kvint8`` runs the same checkpoint with the
scales dropped and fd-core's dynamic int8 cache (what it did before applying
them), ``offline-w4a8c8-kvfp32`` with a float32 cache.
2Bits needs dimensions that are multiples of 128: ``--shapes tiny-moe128``
is tiny-moe with hidden and expert sizes 128.

    python benchmarks/quant_agreement.py --shapes tiny-moe tiny-moe128 --methods wint8 offline-fp8 offline-w4a8c8 offline-2bits

Checkpoints are generated (seeded random weights, so the numbers describe
these models, not trained ERNIE weights) under ``checkpoints/``, once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fd_core.backends.registry import get_backend  # noqa: E402
from fd_core.engine.model_runner import ModelRunner, StepInput  # noqa: E402
from fd_core.quantization import parse_quantization  # noqa: E402
from fd_core.quantization.config import kv_cache_dtype_from_quantization  # noqa: E402
from fd_core.quantization.offline import checkpoint_quantization  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402
from fd_core.testing.greedy import greedy_generate  # noqa: E402

BLOCK_SIZE = 16
METHODS = ("wint8", "wint8-qh", "wint4", "w8a8", "w8a8-qh", "wint4-all")
# labels for --quantization values that are not a bare method name
ALIASES = {  # FastDeploy's mixed form: wint4 for dense layers too (plain wint4 keeps them wint8 on ERNIE)
    "wint4-all": {"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4"},
    # "quantized head": the opt-in int8 LM head (by default it stays float, as in FastDeploy)
    "wint8-qh": {"quantization": "wint8", "lm_head_quant_type": "wint8"},
    "w8a8-qh": {"quantization": "w8a8", "lm_head_quant_type": "w8a8"},
    "wint4-all-qh": {"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4",
                     "lm_head_quant_type": "wint4"},
    # int4 weights x per-token int8 activations everywhere (llama.cpp q4_0's arithmetic), head included
    "w4a8-qh": {"quantization": "w4a8", "lm_head_quant_type": "w4a8"},
    # FastDeploy's W4A8 split: int4 x int8 routed experts, dense layers wint8
    "w4a8-moe": {"quantization": "mix_quant", "dense_quant_type": "wint8", "moe_quant_type": "w4a8"},
    # FastDeploy's W4AFP8 split: int4 x fp8 (e4m3) routed experts, dense layers wint8
    "w4afp8-moe": {"quantization": "mix_quant", "dense_quant_type": "wint8", "moe_quant_type": "w4afp8"},
}


OFFLINE = {"offline-fp8": "fp8", "offline-w4a8c8": "w4a8c8", "offline-2bits": "2bits",
           "offline-w4a8c8-kvint8": "w4a8c8", "offline-w4a8c8-kvfp32": "w4a8c8"}
# offline W4A8C8 with another KV cache than its own, its static KV scales dropped
KV_OVERRIDES = {"offline-w4a8c8-kvint8": "int8", "offline-w4a8c8-kvfp32": "float32"}
SMALL_128: dict[str, Any] = {"hidden_size": 128, "moe_intermediate_size": 128}  # tiny-moe128: wint2 takes multiples of 128


def checkpoint(shape: str, root: Path) -> Path:
    out = root / f"quant-agreement-{shape}-paddle"
    if shape == "tiny-moe128":
        if not (out / "config.json").is_file():
            generate_checkpoint(out, "tiny-moe", naming="paddle", seed=0, **SMALL_128)
        return out
    if shape == "mid-moe":  # moe_decode.py's checkpoint, generated there with its overrides
        from moe_decode import CHECKPOINT, MID_MOE

        out = CHECKPOINT
        if not (out / "config.json").is_file():
            generate_checkpoint(out, "tiny-moe", naming="paddle", seed=3, **MID_MOE)
        return out
    if not (out / "config.json").is_file():
        print(f"generating {out} (once)", file=sys.stderr, flush=True)
        generate_checkpoint(out, shape, naming="paddle", seed=0)
    return out


def offline_checkpoint(model_dir: Path, fmt: str) -> Path:
    """``model_dir`` written in FastDeploy's offline ``fmt`` layout, once, beside it."""
    from fd_core.testing.quantized_checkpoints import quantize_checkpoint

    out = model_dir.parent / f"{model_dir.name}-offline-{fmt}"
    if not (out / "config.json").is_file():
        print(f"writing {out} (once)", file=sys.stderr, flush=True)
        quantize_checkpoint(model_dir, out, fmt)
    return out


def make_runner(model_dir: Path, quantization: Any, num_blocks: int, max_len: int) -> ModelRunner:
    backend = get_backend("cpu")
    if quantization in OFFLINE:  # the stored format, detected from config.json (as the engine does)
        model_dir = offline_checkpoint(model_dir, OFFLINE[quantization])
        config = checkpoint_quantization(model_dir, None)
    else:
        config = parse_quantization(ALIASES.get(quantization, quantization))
    kv = KV_OVERRIDES.get(quantization) or kv_cache_dtype_from_quantization(config) or "float32"
    runner = ModelRunner(model_dir, backend, num_blocks=num_blocks, block_size=BLOCK_SIZE,
                         max_model_len=max_len, quantization=config, kv_cache_dtype=kv)
    if quantization in KV_OVERRIDES:
        for layer in runner.model.layers:
            layer.self_attn.kv_scales = None
    return runner


def describe(model_dir: Path, method: str, architecture: str) -> str:
    """What ``method`` resolves to on this model (an offline format: the stored one)."""
    if method in OFFLINE:
        config = checkpoint_quantization(offline_checkpoint(model_dir, OFFLINE[method]), None)
    else:
        config = parse_quantization(ALIASES.get(method, method), architecture)
    return config.describe() if config is not None else "float"


def teacher_forced_logprobs(runner: ModelRunner, prompts: list[list[int]], targets: list[list[int]],
                            group: int = 4) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per request: log-probabilities of ``targets`` after ``prompt + targets[:i]``,
    and whether the runner's argmax there is the target (``group`` requests per prefill)."""
    lps: list[np.ndarray] = []
    hits: list[np.ndarray] = []
    for first in range(0, len(prompts), group):
        batch = list(zip(prompts[first:first + group], targets[first:first + group]))
        token_ids = [p + t[:-1] for p, t in batch]
        tables, next_block = [], 0
        for ids in token_ids:
            need = -(-len(ids) // BLOCK_SIZE)
            tables.append(list(range(next_block, next_block + need)))
            next_block += need
        step = StepInput(token_ids, [len(ids) for ids in token_ids], tables, 0,
                         [True] * len(token_ids), [True] * len(token_ids))
        logits = runner.execute(step).numpy().astype(np.float64)
        logp = logits - logits.max(axis=-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=-1, keepdims=True))
        row = 0
        for (prompt, target), ids in zip(batch, token_ids):
            rows = logp[row + len(prompt) - 1 : row + len(ids)]  # row j predicts token j + 1
            lps.append(rows[np.arange(len(target)), target])
            hits.append(rows.argmax(axis=-1) == np.asarray(target))
            row += len(ids)
    return lps, hits


def measure(shape: str, methods: list[str], num_prompts: int, num_tokens: int, root: Path,
            seed: int = 0) -> list[dict[str, Any]]:
    model_dir = checkpoint(shape, root)
    rng = np.random.default_rng(seed)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    prompts = [rng.integers(3, vocab, int(rng.integers(8, 25))).tolist() for _ in range(num_prompts)]
    max_len = 24 + num_tokens
    num_blocks = num_prompts * -(-max_len // BLOCK_SIZE) + 1
    fp32 = make_runner(model_dir, None, num_blocks, max_len)
    want, _ = greedy_generate(fp32, prompts, num_tokens)
    want_lp, _ = teacher_forced_logprobs(fp32, prompts, want)
    fp32_bytes = fp32.weight_bytes
    del fp32
    results = []
    for method in methods:
        start = time.perf_counter()
        try:
            runner = make_runner(model_dir, method, num_blocks, max_len)
        except ValueError as exc:  # e.g. offline-2bits on a shape whose sizes are not multiples of 128
            if method not in OFFLINE:
                raise
            print(f"{shape} {method}: skipped ({exc})", file=sys.stderr, flush=True)
            continue
        got, _ = greedy_generate(runner, prompts, num_tokens)
        lp, hits = teacher_forced_logprobs(runner, prompts, want)
        prefix = [next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), len(w)) / len(w)
                  for g, w in zip(got, want)]
        delta = np.abs(np.concatenate(lp) - np.concatenate(want_lp))
        results.append({
            "shape": shape, "method": method,
            "resolved": describe(model_dir, method, runner.config.architecture),
            "prompts": num_prompts, "tokens": num_tokens,
            "prefix": float(np.mean(prefix)),
            "identical": float(np.mean([g == w for g, w in zip(got, want)])),
            "top1": float(np.concatenate(hits).mean()),
            "dlogprob_mean": float(delta.mean()), "dlogprob_max": float(delta.max()),
            "fp32_bytes": fp32_bytes, "weight_bytes": runner.weight_bytes,
            "seconds": round(time.perf_counter() - start, 1),
        })
        del runner
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["tiny-dense", "tiny-moe"])
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints")
    p.add_argument("--json", action="store_true", help="print one JSON object per result")
    args = p.parse_args(argv)
    if not args.json:
        print(f"{'shape':<12}{'method':<16}{'prefix':>8}{'identical':>10}{'top1':>8}"
              f"{'|dlp| mean':>12}{'|dlp| max':>11}{'fp32 MiB':>10}{'quant MiB':>10}  resolved")
    for shape in args.shapes:
        for r in measure(shape, args.methods, args.prompts, args.tokens, args.checkpoints):
            if args.json:
                print(json.dumps(r), flush=True)
                continue
            print(f"{r['shape']:<12}{r['method']:<16}{r['prefix']:>8.3f}{r['identical']:>10.3f}"
                  f"{r['top1']:>8.3f}{r['dlogprob_mean']:>12.4f}{r['dlogprob_max']:>11.4f}"
                  f"{r['fp32_bytes'] / 2**20:>10.1f}{r['weight_bytes'] / 2**20:>10.1f}  {r['resolved']}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
