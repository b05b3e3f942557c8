"""Decode steps of the mid-size MoE on fd_x86 with the routed experts in each
expert format, in one run: wint8, wint4, and the offline checkpoints'
w4a8_static (W4A8C8) and wint2 (2Bits), ratios to wint8 and bytes per step.

The model is ``benchmarks/moe_decode.py``'s ``MID_MOE`` (hidden 1024, 1 dense
+ 3 MoE layers of 16 experts top-4, expert width 768, a shared expert),
built once with ``--quantization wint8``. The other formats' experts are
made from the wint8 experts' dequantized weights (wint4: groups of 128;
w4a8_static: int4 per channel with a static activation max; wint2: random
codes with per-channel scales of the weights' size: the kernels' speed does
not depend on the values) and swapped into the MoE layers between timed
runs; attention, the shared experts, the dense layer and the LM head stay
wint8 in every variant, and the KV cache is the one prefill wrote. Every
number is the median (and fastest) of ``--repeats`` runs of ``--steps``
decode steps, the variants' runs alternating, so load from other processes
falls on all of them. Expert bytes per step: the distinct experts the steps
route to (counted once per variant with the MoE layer op off, where the
routing is a separate call) times each format's bytes per expert.

    python benchmarks/offline_moe_decode.py                   # B = 1 8, all four formats
    FD_CPU_NUM_THREADS=1 python benchmarks/offline_moe_decode.py --repeats 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from decode_step import BLOCK_SIZE, Batch  # noqa: E402
from moe_decode import _cpu_model, checkpoint  # noqa: E402

from fd_core._paddle import import_paddle  # noqa: E402
from fd_core.backends.cpu import num_threads  # noqa: E402
from fd_core.backends.registry import get_backend  # noqa: E402
from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.layers.mlp import MoE  # noqa: E402
from fd_core.ops.linear import QuantizedWeight  # noqa: E402
from fd_core.quantization import parse_quantization  # noqa: E402
from fd_core.quantization.weights import quantize_array  # noqa: E402
from fd_core.quantization.wint import quantize_int4  # noqa: E402
from fd_core.quantization.wint2 import pack_scales  # noqa: E402

paddle = import_paddle()
FORMATS = ("wint8", "wint4", "w4a8_static", "wint2")


def _floats(quant: QuantizedWeight) -> list[np.ndarray]:
    """A stacked wint8 weight -> each expert's float ``[in, out]``."""
    q, s = quant.qweight.numpy().astype(np.float32), quant.scales.numpy()
    return [(q[e] * s[e].reshape(-1, 1)).T for e in range(q.shape[0])]


def _convert(fmt: str, weights: list[np.ndarray], rng: np.random.Generator) -> QuantizedWeight:
    d_in, d_out = weights[0].shape
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    group = -1
    for w in weights:
        if fmt == "wint4":
            qw, sc, group = quantize_array("wint4", w, 128)
            parts.append((qw, sc))
        elif fmt == "w4a8_static":
            packed, w_scale = quantize_int4(w, group_size=-1)
            parts.append((packed, np.stack([w_scale[:, 0], np.full(d_out, 4.0, np.float32)], axis=1)))
        else:  # wint2
            group = 64
            qw = rng.integers(0, 256, (d_in // 4, d_out), dtype=np.uint8)
            ws = rng.integers(0x88, 0x100, (d_in // 128, d_out), dtype=np.uint8)
            sup = (np.abs(w).max(axis=0) / (15 * 31)).astype(np.float32)
            parts.append((qw, pack_scales(ws, sup, np.full(d_out, 100.3, np.float32), np.zeros(d_out, np.float32))))
    return QuantizedWeight(fmt, paddle.to_tensor(np.stack([p[0] for p in parts])),
                           paddle.to_tensor(np.stack([p[1] for p in parts]).astype(np.float32)), d_in, d_out, group)


def _nbytes(quant: QuantizedWeight) -> int:
    return sum(int(t.numel()) * t.element_size() for t in (quant.qweight, quant.scales))


def _experts_routed(b: Batch, steps: int) -> list[int]:
    """Distinct experts per MoE layer call over ``steps`` decode steps (the layer op off)."""
    import fd_x86.moe

    counts: list[int] = []
    real = fd_x86.moe.select_experts

    def counted(*args: Any) -> Any:
        out = real(*args)
        if out is not None:
            counts.append(len(set(out[1].numpy().reshape(-1).tolist())))
        return out

    fd_x86.moe.select_experts = counted  # type: ignore[assignment]
    os.environ["FD_X86_MOE_LAYER"] = "0"
    try:
        b.time_decode(steps)
    finally:
        os.environ.pop("FD_X86_MOE_LAYER", None)
        fd_x86.moe.select_experts = real  # type: ignore[assignment]
    return counts


def run(args: argparse.Namespace) -> None:
    backend = get_backend("x86")
    print(f"{_cpu_model()}, {os.cpu_count()} CPUs, {num_threads()} kernel threads, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    max_len = args.prompt_len + args.steps + 2
    blocks = -(-max_len // BLOCK_SIZE)
    runner = ModelRunner(checkpoint(), backend, num_blocks=1 + blocks * sum(args.batch), block_size=BLOCK_SIZE,
                         max_model_len=1024, quantization=parse_quantization("wint8", "Ernie4_5_MoeForCausalLM"))
    runner.warmup()
    moes = [layer.mlp for layer in runner.model.layers if isinstance(layer.mlp, MoE)]
    rng = np.random.default_rng(0)
    variants: dict[str, list[tuple[QuantizedWeight, QuantizedWeight]]] = {"wint8": [
        (m.up_gate_proj.data, m.down_proj.data) for m in moes]}
    floats = [(_floats(m.up_gate_proj.data), _floats(m.down_proj.data)) for m in moes]
    for fmt in args.formats:
        if fmt != "wint8":
            variants[fmt] = [(_convert(fmt, up, rng), _convert(fmt, down, rng)) for up, down in floats]
    per_expert = {fmt: sum(_nbytes(q) for q in v[0]) // int(v[0][0].qweight.shape[0]) for fmt, v in variants.items()}
    print("bytes per expert (up_gate + down, codes + scales): " + ", ".join(
        f"{fmt} {per_expert[fmt] / 2**20:.2f} MiB" for fmt in args.formats), flush=True)

    def use(fmt: str) -> None:
        for m, (up, down) in zip(moes, variants[fmt]):
            m.up_gate_proj.data, m.down_proj.data = up, down

    first = 1
    for batch in args.batch:
        b = Batch(runner, batch, args.prompt_len, max_len, first, np.random.default_rng(1))
        first += batch * blocks
        use("wint8")
        b.prefill()
        routed = statistics.mean(_experts_routed(b, 2))  # experts per MoE layer per step
        times: dict[str, list[float]] = {fmt: [] for fmt in args.formats}
        for fmt in args.formats:  # warm every variant
            use(fmt)
            b.time_decode(2)
        for _ in range(args.repeats):
            for fmt in args.formats:
                use(fmt)
                times[fmt].append(b.time_decode(args.steps))
        med = {fmt: statistics.median(t) for fmt, t in times.items()}
        best = {fmt: min(t) for fmt, t in times.items()}
        print(f"B={batch}: {routed:.1f} distinct experts per MoE layer per step, {len(moes)} MoE layers; "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
        for fmt in args.formats:
            step_bytes = routed * len(moes) * per_expert[fmt]
            print(f"  {fmt:12s} {med[fmt]:7.2f} ms/step (fastest {best[fmt]:6.2f}), {batch * 1e3 / med[fmt]:6.1f} "
                  f"tok/s, vs wint8 {med['wint8'] / med[fmt]:.3f}x (fastest {best['wint8'] / best[fmt]:.3f}x), "
                  f"expert bytes {step_bytes / 2**20:6.2f} MiB/step", flush=True)
    use("wint8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if "wint8" not in args.formats:
        args.formats.insert(0, "wint8")
    run(args)


if __name__ == "__main__":
    main()
