"""Decode steps of a mid-size MoE on fd_x86: the native MoE op against the
per-expert path, in one run, with a profile of where a step goes.

The model is ``tiny-moe`` with overrides (``MID_MOE``): hidden 1024, 4
layers (1 dense + 3 MoE), 16 experts top-4, expert width 768, 1 shared
expert, 16 heads x 64 (2 KV heads); generated once under ``checkpoints/``.
For each ``--quantization`` (wint8 / wint4: experts int4, the rest int8)
it builds one runner, prefills B prompts, then alternates timed runs of
decode steps over five paths (``--paths`` picks some): ``FD_X86_MOE_NATIVE=0``
(the per-expert path: ``fd_core.ops.moe.grouped_experts`` over the
contract-layout linears), ``FD_X86_MOE_LAYER=0`` (the native ops: router
linear, ``fd_x86_moe_select``, ``fd_x86_moe_experts_shared``: three calls
per MoE layer), ``fd_x86_moe_layer`` (one call per MoE layer, the routing
inside), these three with each MoE layer's attention half op by op (the
model's MoE layers unfused, as before they ran it through
``Ops.decoder_layers``), the layer op after the attention half in one
``fd_x86_decoder_layers`` call (with the dense layer before it, if any:
``fused``), and the default, ``run``: the MoE blocks inside the fused run,
the whole stack one ``fd_x86_decoder_layers`` call a step. Each
number is the median (and the fastest) of ``--repeats`` runs of ``--steps``
steps; the paths' runs alternate, so load from other processes falls on all
of them.

``--profile`` times, per step, every backend op call (router linear,
routing, experts, shared-expert and attention linears, norms, attention)
and, inside the per-expert path, the expert kernels apart from the Python,
gathers and scatters around them; at B = 1 it also prints the MoE layers'
bytes (router, shared expert, top-k of the routed experts) and the layer
op's time against them at the read bandwidth measured right then.

    python benchmarks/moe_decode.py                       # wint8 wint4, B = 1 8
    python benchmarks/moe_decode.py --quantization wint4 --batch 1 --profile
    python benchmarks/moe_decode.py --paths layer fused     # the MoE layers' attention half fused or not
    python benchmarks/moe_decode.py --paths fused run --quantization w4a8   # the MoE blocks in the fused run or not
    python benchmarks/moe_decode.py --paths run loop --quantization wint4 \
        --checkpoint ~/.cache/fd_core/ernie21b/bf16      # a step's MoE tokens in one region or expert by expert
    python benchmarks/moe_decode.py --call-overhead      # per-call cost of one MoE layer, tiny weights

``loop`` is the default path (``run``) with ``FD_X86_MOE_FEW_TOKENS=0``: a decode
step's few tokens run expert by expert (a parallel region per linear), as
before they ran in one region (``x86_moe_op.cc`` ``moe_few_tokens``).
``--checkpoint`` times another ERNIE MoE checkpoint instead of the mid-size one.

``--call-overhead`` times ``Ops.moe_layer`` at T = 1 on a tiny wint8 layer
(hidden 128, 16 experts top-4, width 128, 1 shared: the kernels take a few
us) through the layer op and through the native ops, and the layer op called
directly with its arguments ready: the difference is Python and dispatch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from decode_step import BLOCK_SIZE, Batch  # noqa: E402

from fd_core.backends.registry import get_backend  # noqa: E402
from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.quantization import parse_quantization  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402

MID_MOE: dict[str, Any] = {
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 4, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 64, "moe_num_experts": 16, "moe_k": 4, "moe_intermediate_size": 768,
    "moe_num_shared_experts": 1, "moe_layer_start_index": 1, "moe_layer_end_index": 3, "moe_layer_interval": 1,
    "moe_capacity": [16, 16, 16],
}
CHECKPOINT = ROOT / "checkpoints" / "ernie-mid-moe-paddle"


def checkpoint() -> Path:
    if not (CHECKPOINT / "config.json").is_file():
        print(f"generating {CHECKPOINT} (once)", flush=True)
        generate_checkpoint(CHECKPOINT, "tiny-moe", naming="paddle", seed=3, **MID_MOE)
    return CHECKPOINT


class Profile:
    """Timers around the runner's ops (and the per-expert kernels inside
    ``fd_x86.moe``'s reference-grouped path): ms per step by family, each
    op's own time (less the timed ops it calls)."""

    def __init__(self, ops: Any, hidden: int, experts: int) -> None:
        self.ops, self.hidden, self.experts = ops, hidden, experts
        self.totals: dict[str, float] = defaultdict(float)
        self._saved: dict[str, Any] = {}
        self._nested: list[float] = []  # per running timed op: its inner timed ops' time

    def _wrap(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            # self time: an op that runs others (decoder_layers composing the separate ops
            # when the backend declines) counts its time less theirs
            self._nested.append(0.0)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            elapsed = time.perf_counter() - start
            inner = self._nested.pop()
            if self._nested:
                self._nested[-1] += elapsed
            family = name
            if name == "linear":
                weight = args[1] if len(args) > 1 else kwargs.get("weight")
                quant = args[3] if len(args) > 3 else kwargs.get("quant")
                n = weight.shape[-1] if weight is not None else getattr(quant, "out_features", 0)
                family = "router linear" if n == self.experts else "linears (attn, dense, shared, head)"
            self.totals[family] += elapsed - inner
            return out
        return timed

    def __enter__(self) -> Profile:
        import fd_x86.moe as xmoe

        names = ["linear", "moe_layer", "moe_select_experts", "moe_experts", "moe_experts_with_shared", "rms_norm",
                 "silu_and_mul",
                 "decode_attention", "rope_and_write_kv_cache", "write_kv_cache", "rotary_embedding", "decoder_layers"]
        for name in names:
            self._saved[name] = getattr(self.ops, name)
            setattr(self.ops, name, self._wrap(name, self._saved[name]))
        self._kernel = xmoe.quantized_linear
        totals = self.totals

        def kernel(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = self._kernel(*args, **kwargs)
            totals["  of which expert kernels"] += time.perf_counter() - start
            return out
        xmoe.quantized_linear = kernel
        return self

    def __exit__(self, *exc: Any) -> None:
        import fd_x86.moe as xmoe

        for name in self._saved:
            delattr(self.ops, name)
        xmoe.quantized_linear = self._kernel


def moe_step_bytes(model: Any, top_k: int) -> int:
    """Bytes the MoE layers read in a B=1 decode step: per layer the router
    (gate, correction bias), the shared expert, and top_k of the E routed
    experts' stacked weights (codes + scales)."""
    from fd_core.quantization.weights import resident_bytes

    total = 0
    for name, param in model.parameters().items():
        if ".gate" in name or "e_score" in name or "shared_experts." in name:
            total += resident_bytes(param.data)
        elif ".experts." in name and param.data is not None:
            experts = int((param.data.qweight if hasattr(param.data, "qweight") else param.data).shape[0])
            total += resident_bytes(param.data) * top_k // experts
    return total


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def run(args: argparse.Namespace) -> None:
    backend = get_backend("x86")
    print(f"{_cpu_model()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    max_len = args.prompt_len + args.steps + 2
    blocks = -(-max_len // BLOCK_SIZE)
    for method in args.quantization:
        quantization = parse_quantization(method, "Ernie4_5_MoeForCausalLM")
        runner = ModelRunner(args.checkpoint or checkpoint(), backend, num_blocks=1 + blocks * sum(args.batch), block_size=BLOCK_SIZE,
                             max_model_len=1024, quantization=quantization)
        runner.warmup()
        first = 1
        for batch in args.batch:
            b = Batch(runner, batch, args.prompt_len, max_len, first, __import__("numpy").random.default_rng(0))
            first += batch * blocks
            b.prefill()
            modes = [m for m in MODES if m in args.paths]
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            for mode in modes:  # warm every path
                _set_mode(mode, runner.model)
                b.time_decode(2)
            for _ in range(args.repeats):
                for mode in modes:
                    _set_mode(mode, runner.model)
                    times[mode].append(b.time_decode(args.steps))
            med = {mode: statistics.median(t) for mode, t in times.items()}
            best = {mode: min(t) for mode, t in times.items()}
            print(f"{method:6s} B={batch:<3d} " + "  ".join(
                f"{MODES[m]} {med[m]:6.2f} ms/step ({batch * 1e3 / med[m]:6.1f} tok/s)" for m in modes), flush=True)
            print(f"           load average {os.getloadavg()[0]:.1f}", flush=True)
            for slow, fast in (("ops", "layer"), ("0", "layer"), ("layer", "fused"), ("fused", "run"), ("loop", "run")):
                if slow in med and fast in med:
                    print(f"           {MODES[fast]} vs {MODES[slow]}: {med[slow] / med[fast]:.3f}x (fastest runs "
                          f"{best[slow] / best[fast]:.3f}x)", flush=True)
            if args.profile:
                for mode in modes:
                    _set_mode(mode, runner.model)
                    with Profile(runner.ops, runner.config.hidden_size, runner.config.num_experts) as prof:
                        total = b.time_decode(args.steps)
                    print(f"  profile, {MODES[mode]}: {total:.2f} ms/step")
                    top = sorted((kv for kv in prof.totals.items() if not kv[0].startswith(" ")), key=lambda kv: -kv[1])
                    for name, secs in top:
                        print(f"    {name:38s} {secs / args.steps * 1e3:7.3f} ms")
                        sub = prof.totals.get("  of which expert kernels") if name == "moe_experts" else None
                        if sub is not None:
                            print(f"    {'  of which expert kernels':38s} {sub / args.steps * 1e3:7.3f} ms")
                    rest = total - sum(v for k, v in prof.totals.items() if not k.startswith(" ")) / args.steps * 1e3
                    print(f"    {'rest (model Python, embed, sampling-free)':38s} {rest:7.3f} ms")
                    if batch == 1 and "moe_layer" in prof.totals:
                        from dtypes import read_seconds

                        from fd_core.backends.cpu import num_threads

                        nbytes = moe_step_bytes(runner.model, runner.config.moe_k)
                        bandwidth = (512 << 20) / read_seconds(512 << 20, num_threads(), repeats=3)
                        secs = prof.totals["moe_layer"] / args.steps
                        print(f"    moe_layer reads {nbytes / 1e6:.2f} MB a step: {secs * bandwidth / nbytes:.2f}x "
                              f"its floor at {bandwidth / 1e9:.1f} GB/s (read now, {num_threads()} threads)")
        _set_mode("fused", runner.model)


# path -> label: FD_X86_MOE_NATIVE=0, FD_X86_MOE_LAYER=0, both on, each with the MoE layers'
# attention half op by op (the MoE layers unfused); everything on (the default)
MODES = {"0": "per-expert path", "ops": "native ops", "layer": "layer op",
         "fused": "layer op + fused attention",
         "run": "MoE block in the fused run",
         "loop": "the same, a step's tokens expert by expert (FD_X86_MOE_FEW_TOKENS=0)"}


def _set_mode(mode: str, model: Any = None) -> None:
    os.environ["FD_X86_MOE_NATIVE"] = "0" if mode == "0" else "1"
    os.environ["FD_X86_MOE_LAYER"] = "1" if mode in ("layer", "fused", "run", "loop") else "0"
    os.environ["FD_X86_MOE_FEW_TOKENS"] = "0" if mode == "loop" else "1"
    os.environ["FD_X86_FUSED_MOE_RUN"] = "1" if mode in ("run", "loop") else "0"
    if model is not None:
        for layer in model.layers:
            if not layer.is_dense:
                layer.fused = mode in ("fused", "run", "loop")
        model._runs = model._plan_runs()


def call_overhead() -> None:
    """us per ``Ops.moe_layer`` call at T = 1 on a tiny wint8 layer (best of 5 x 2000 calls)."""
    import numpy as np
    import paddle
    from fd_x86.build import load_ops

    from fd_core.ops.linear import QuantizedWeight
    from fd_core.quantization.weights import quantize_weight

    ops = get_backend("x86").ops
    rng = np.random.default_rng(0)
    d, inter, experts, k = 128, 128, 16, 4

    def stack(d_in: int, d_out: int) -> QuantizedWeight:
        qs = [quantize_weight("wint8", paddle.to_tensor(rng.normal(0, 0.1, (d_in, d_out)).astype(np.float32)))
              for _ in range(experts)]
        return QuantizedWeight("wint8", paddle.stack([q.qweight for q in qs]), paddle.stack([q.scales for q in qs]),
                               d_in, d_out, qs[0].group_size)

    def dense(d_in: int, d_out: int) -> Any:
        return quantize_weight("wint8", paddle.to_tensor(rng.normal(0, 0.1, (d_in, d_out)).astype(np.float32)))

    quant = (stack(d, 2 * inter), stack(inter, d))
    shared = (dense(d, 2 * inter), dense(inter, d))
    gate = paddle.to_tensor(rng.normal(0, 0.1, (d, experts)).astype(np.float32))
    bias = paddle.to_tensor(rng.normal(0, 0.01, experts).astype(np.float32))
    x = paddle.to_tensor(rng.normal(0, 1, (1, d)).astype(np.float32))

    def call() -> Any:
        return ops.moe_layer(x, gate, bias, k, True, 1e-12, None, None, quant, *shared)

    def best_us(fn: Any, n: int = 2000) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - start) / n)
        return best * 1e6

    _set_mode("layer")
    call()
    entry = quant[0].backend_cache["x86.moe_layer"]  # type: ignore[attr-defined]
    op = load_ops().fd_x86_moe_layer
    rows = {"layer op (Ops.moe_layer)": best_us(call),
            "layer op called directly": best_us(lambda: op(x, *entry[1], k, True, True, 1e-12, *entry[2], 2, 0))}
    _set_mode("ops")
    rows["native ops (Ops.moe_layer, FD_X86_MOE_LAYER=0)"] = best_us(call)
    _set_mode("layer")
    for name, us in rows.items():
        print(f"{name:48s} {us:7.1f} us per MoE layer call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quantization", nargs="+", default=["wint8", "wint4"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--paths", nargs="+", choices=list(MODES), default=list(MODES),
                        help="which paths to time (default: all): " + ", ".join(f"{k} = {v}" for k, v in MODES.items()))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="another ERNIE MoE checkpoint (e.g. real_size.py's 21B bf16 files); default the mid-size")
    parser.add_argument("--call-overhead", action="store_true", help="only the per-call timing on tiny weights")
    args = parser.parse_args()
    if args.call_overhead:
        call_overhead()
    else:
        run(args)


if __name__ == "__main__":
    main()
