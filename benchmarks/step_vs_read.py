"""A batch-1 decode step of fd-core against a replay of its weight reads, taking turns in one run.

At batch 1 a decode step reads every weight it uses once. ``x86_read_pattern/read_pattern.cc`` (built here
with g++, no paddle) replays those reads for the checkpoint's shape with no arithmetic: per layer the
attention's weights, the dense MLP or the MoE layer's router, top-k routed experts (drawn at random) and
shared experts, then the head, each weight one parallel region split among the threads as fd_x86's kernels
split it, 2 MiB pages. This script loads the checkpoint with fd-core (x86, one step a schedule, greedy), then
alternates: ``--steps`` decode steps after a 128-token prompt, then the replay of as many steps, ``--pairs``
times. ``step / replay`` is how far the step is from the fastest any engine could read these bytes on this
machine at that moment (the replay also prints a contiguous read of the same bytes).

    python benchmarks/step_vs_read.py --checkpoint ~/.cache/fd_core/ernie21b/bf16     # the 21B (real_size.py's)
    python benchmarks/step_vs_read.py                                                 # the 0.3B, w4a8
    python benchmarks/step_vs_read.py --quantization wint8
    python benchmarks/step_vs_read.py --checkpoint ~/.cache/fd_core/ernie21b/bf16 --quantization wint4

A model whose step reads about the size of the last-level cache or less (the mid-size MoE: ~30 MB) is read
from the cache in part, on both sides: the comparison is for models well beyond it.

``--quantization``: w4a8 with a w4a8 head (int4 codes, an fp32 scale per 128: 0.53125 bytes a weight
everywhere), wint8 or w8a8 with an int8 head (1 byte plus an fp32 scale a channel: ~1), or ``wint4``,
FastDeploy's rule on ERNIE MoE models (routed experts int4, the attention, dense and shared-expert linears
int8, the head float: 2 bytes a weight for a bf16 / fp16 checkpoint under ``--dtype auto``, 4 for fp32). Needs
an x86-64 CPU with AVX-512 and g++.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dtypes import cpu_model, decode_seconds  # noqa: E402
from engine_overhead import checkpoint  # noqa: E402

SOURCE = ROOT / "benchmarks" / "x86_read_pattern" / "read_pattern.cc"
INT4 = 0.5 + 4 / 128  # int4 codes and an fp32 scale per group of 128
INT8 = 1.0  # int8 codes (an fp32 scale per channel: ~0.1% more at these widths)
# --quantization -> (fd-core's --quantization, bytes a weight: the linears, the routed experts, the head; None:
# the head float, as the checkpoint's dtype)
CONFIGS: dict[str, tuple[Any, float, float, float | None]] = {
    "w4a8": ({"quantization": "w4a8", "lm_head_quant_type": "w4a8"}, INT4, INT4, INT4),
    "wint8": ({"quantization": "wint8", "lm_head_quant_type": "wint8"}, INT8, INT8, INT8),
    "w8a8": ({"quantization": "w8a8", "lm_head_quant_type": "w8a8"}, INT8, INT8, INT8),
    "wint4": ("wint4", INT8, INT4, None),
}
FLOAT_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}


def build(out_dir: Path) -> Path:
    """The replay binary, rebuilt when the source is newer."""
    binary = out_dir / "read_pattern"
    if not binary.is_file() or binary.stat().st_mtime < SOURCE.stat().st_mtime:
        out_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["g++", "-O2", "-mavx512f", "-fopenmp", str(SOURCE), "-o", str(binary)], check=True)
    return binary


def shape_args(config: dict[str, Any], bytes_per_weight: float) -> list[str]:
    """read_pattern's shape arguments for an ERNIE 4.5 config.json (dense or MoE), the linears at
    ``bytes_per_weight``. The replay puts the MoE layers from ``moe_layer_start_index`` to the last; a
    config with MoE layers otherwise placed (an interval, an earlier end) is refused (ValueError)."""
    layers = int(config["num_hidden_layers"])
    experts = config.get("moe_num_experts") or 0
    experts = experts[0] if isinstance(experts, list) else int(experts)
    start = config.get("moe_layer_start_index", layers if not experts else 0)
    start = start[0] if isinstance(start, list) else int(start)
    end = config.get("moe_layer_end_index", -1)
    end = end[0] if isinstance(end, list) else int(end)
    interval = int(config.get("moe_layer_interval", 1) or 1)
    if experts and (interval != 1 or end not in (-1, layers - 1)):
        raise ValueError(f"MoE layers every {interval} up to layer {end}: the replay takes every layer from "
                         f"moe_layer_start_index to the last (interval 1, end -1 or {layers - 1})")
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return [str(v) for v in (
        config["hidden_size"], layers, start if experts else layers, config["intermediate_size"],
        config.get("moe_intermediate_size") or 0, experts, config.get("moe_k") or 0,
        config.get("moe_num_shared_experts") or 0, heads, config.get("num_key_value_heads") or heads, head_dim,
        config["vocab_size"], bytes_per_weight)]


def widths(name: str, dtype: str) -> tuple[float, float, float]:
    """The replay's bytes a weight (linears, routed experts, head) for ``--quantization name``; a float head
    is in ``dtype``, the weights' dtype the engine chose (``ModelRunner.dtype``)."""
    _, linears, experts, head = CONFIGS[name]
    if head is None:
        if dtype not in FLOAT_BYTES:
            raise ValueError(f"--quantization {name}: the float head's dtype {dtype!r} is not one of "
                             f"{', '.join(FLOAT_BYTES)}")
        head = FLOAT_BYTES[dtype]
    return linears, experts, head


def replay(binary: Path, shape: list[str], threads: int, steps: int, placed: int, experts: float | None = None,
           head: float | None = None) -> tuple[float, float, float]:
    """(ms a step, ms of the contiguous read, MB a step) of one replay round; ``experts`` / ``head``: their
    bytes a weight where they differ from the linears'."""
    width = shape[-1]
    extra = [str(experts if experts is not None else width), str(head if head is not None else width)]
    out = subprocess.run([str(binary), *shape, str(threads), "1", str(steps), str(placed), *extra], check=True,
                         capture_output=True, text=True).stdout
    m = re.search(r"step bytes ([\d.]+) MB, ([\d.]+) ms .*contiguous read ([\d.]+) ms", out)
    if m is None:
        raise RuntimeError(f"read_pattern printed no round: {out!r}")
    return float(m.group(2)), float(m.group(3)), float(m.group(1))


def fd_step_ms(llm: Any, steps: int, seed: int) -> float:
    """ms a greedy B=1 decode step, over ``steps`` steps after a 128-token prompt of random ids."""
    prompt = [int(t) for t in np.random.default_rng(seed).integers(100, 2000, 128)]
    return decode_seconds(llm, [prompt], steps + 1) * 1e3 / steps  # the first token comes with the prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=None, help="an ERNIE 4.5 checkpoint directory")
    parser.add_argument("--shape", choices=["mid-moe", "0.3b"], default="0.3b",
                        help="the generated checkpoint when --checkpoint is not given")
    parser.add_argument("--quantization", default="w4a8", choices=list(CONFIGS),
                        help="w4a8, wint8, w8a8 (each with the same head) or wint4 (FastDeploy's rule)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="the replay's threads (default: fd-core's, "
                        "FD_CPU_NUM_THREADS or the usable cores)")
    parser.add_argument("--placed", type=int, default=16,
                        help="experts the replay lays out per layer (the top-k drawn among them; the bytes a step "
                        "reads do not change; fewer keep its buffer small beside the loaded model)")
    parser.add_argument("--build-dir", type=Path, default=Path.home() / ".cache" / "fd_core" / "read_pattern")
    args = parser.parse_args()
    from fd_core.backends.cpu import num_threads

    args.threads = num_threads() if args.threads is None else args.threads
    if args.pairs < 1 or args.steps < 1 or args.threads < 1 or args.placed < 1:
        parser.error("--pairs, --steps, --threads and --placed must be positive")
    path = args.checkpoint if args.checkpoint is not None else checkpoint(args.shape)
    config = json.loads((path / "config.json").read_text())
    try:
        shape_args(config, 1.0)
    except ValueError as e:
        parser.error(f"{path}: {e}")
    quantization = CONFIGS[args.quantization][0]
    binary = build(args.build_dir)
    print(f"CPU: {cpu_model()}; {args.threads} threads; {path}; {quantization}", flush=True)
    from fd_core import LLM

    begin = time.perf_counter()
    llm = LLM(str(path), backend="x86", quantization=quantization, dtype="auto",
              max_model_len=128 + args.steps + 64, max_num_seqs=1, enable_prefix_caching=False)
    dtype = llm.engine.core.runner.dtype
    try:
        linears, experts, head = widths(args.quantization, dtype)
    except ValueError as e:
        parser.error(str(e))
    shape = shape_args(config, linears)
    print(f"loaded in {time.perf_counter() - begin:.0f} s; weights {dtype}; replay bytes a weight: linears "
          f"{linears:g}, routed experts {experts:g}, head {head:g}", flush=True)
    fd_step_ms(llm, 4, 0)  # warm
    ratios, fd_all, rp_all, flat_all = [], [], [], []
    for i in range(args.pairs):
        fd = fd_step_ms(llm, args.steps, 1 + i)
        rp, flat, mb = replay(binary, shape, args.threads, args.steps, args.placed, experts, head)
        ratios.append(fd / rp)
        fd_all.append(fd)
        rp_all.append(rp)
        flat_all.append(flat)
        print(f"pair {i}: fd-core step {fd:.2f} ms; replay of its {mb:.1f} MB {rp:.2f} ms ({mb / rp:.1f} GB/s), "
              f"contiguous {flat:.2f} ms; step / replay {fd / rp:.3f}", flush=True)
    print(f"median: fd-core {statistics.median(fd_all):.2f} ms ({1e3 / statistics.median(fd_all):.1f} tok/s), "
          f"replay {statistics.median(rp_all):.2f} ms ({1e3 / statistics.median(rp_all):.1f} steps/s), contiguous "
          f"{statistics.median(flat_all):.2f} ms; step / replay {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}); load average {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
