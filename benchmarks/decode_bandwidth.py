"""Batch-1 decode against the memory floor, per quantization, in one run.

At batch 1 a decode step must read every weight it uses once: the layers'
linears (in the form the kernels read: int8 / int4 codes plus scales, or
16/32-bit floats), the norms, the LM head, and one row of the embeddings.
For each configuration this prints the B=1 decode step time (``engine.step()``
after a ``--prompt``-token prompt: scheduler, forward, greedy sampler), those
bytes, the machine's read bandwidth measured in the same run (``dtypes.py``'s
``read_seconds`` over a ``--probe-mib`` buffer, threads as fd-core uses,
taken between the configurations' rounds), and the ratio

    step time / (bytes / bandwidth)          (1.00 = at the memory floor)

plus greedy agreement with fp32 (``--agree-prompts`` prompts x
``--agree-tokens`` tokens: the fraction of sequences identical throughout,
the mean fraction of tokens equal before the first divergence, and the mean
|logprob - fp32's| of fp32's greedy tokens scored teacher-forced
(``prompt_logprobs``) by each configuration).

    python benchmarks/decode_bandwidth.py                       # 0.3B, x86, LM head quantized like the layers
    python benchmarks/decode_bandwidth.py --lm-head float       # FastDeploy's default float head
    python benchmarks/decode_bandwidth.py --configs wint8,int4 --rounds 5 --kernels
    python benchmarks/decode_bandwidth.py --configs fp32,int4:float,int4:same   # one config, two heads, one run

Configurations: fp32, bf16 (``--dtype bfloat16``), wint8, int4 (FastDeploy's
``mix_quant`` with wint4 dense layers: plain ``wint4`` keeps an ERNIE dense
model at wint8), w8a8. ``--lm-head same`` (default) quantizes the head with
the configuration's method (int8 for wint8 / w8a8, int4 for int4), ``float``
keeps it float (FastDeploy's default; ``--dtype auto``: bf16 for the 0.3B),
``int8`` uses wint8 (w8a8 under w8a8); ``config:head`` in ``--configs``
overrides it per configuration. Quantized configurations run with
``--dtype auto`` for what is not quantized.
``--kernels`` adds the quantized linears' kernels alone (one row, one call
per weight, through ``fd_x86.linear``) against their bytes' floor, in total
and per weight shape, each also less the calls' dispatch (``quantized_linear``
on a 64 x 64 weight, timed apart): what the step costs beyond them is
attention, norms, the engine's Python and the threads' waits.
The configurations take turns round by round, so the noise of a shared
machine hits them alike. The CPU model is printed first; read the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dtypes import cpu_model, read_seconds  # noqa: E402

from fd_core import LLM, SamplingParams  # noqa: E402
from fd_core.model_loader.accounting import resident_params  # noqa: E402
from fd_core.quantization.weights import resident_bytes  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402

CHECKPOINT = ROOT / "checkpoints" / "ernie-4.5-0.3b-paddle"
CONFIGS = ("fp32", "bf16", "wint8", "int4", "w8a8", "w4a8")
_METHOD = {"wint8": "wint8", "int4": "wint4", "w8a8": "w8a8", "w4a8": "w4a8"}


def quantization(config: str, lm_head: str, group_size: int) -> dict[str, Any] | None:
    """The ``quantization`` argument for ``config`` with the ``lm_head`` choice."""
    method = _METHOD.get(config)
    if method is None:
        return None
    spec: dict[str, Any] = ({"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4"}
                            if config == "int4" else {"quantization": method})
    spec["group_size"] = group_size
    if lm_head == "same":
        spec["lm_head_quant_type"] = method
    elif lm_head == "int8":
        spec["lm_head_quant_type"] = "w8a8" if method in ("w8a8", "w4a8") else "wint8"
    return spec


def step_bytes(model: Any) -> int:
    """Bytes one B=1 decode step reads: every resident weight's storage (codes +
    scales for quantized ones) except the embedding table, of which one row (the
    table may be a tied float head's view, which ``resident_params`` leaves out),
    and of a MoE layer's stacked routed experts the ``top_k`` its token is routed to."""
    from fd_core.layers.mlp import MoE

    embed = getattr(model, "embed_tokens", None)
    routed = {}  # id(stacked experts param) -> (top_k, experts)
    for layer in getattr(model, "layers", ()):
        mlp = getattr(layer, "mlp", None)
        if isinstance(mlp, MoE):
            experts = int(mlp.gate.shape[1])
            for param in (mlp.up_gate_proj, mlp.down_proj):
                routed[id(param)] = (mlp.top_k, experts)
    total = 0
    for p in resident_params(model):
        if p.data is None or p is embed:
            continue
        k, experts = routed.get(id(p), (1, 1))
        total += resident_bytes(p.data) * k // experts
    if embed is not None and embed.data is not None:
        total += resident_bytes(embed.data) // int(embed.data.shape[0])
    return total


def kernel_seconds(model: Any, repeats: int = 5) -> list[tuple[str, float, int, int]]:
    """Per shape of the model's 2-D quantized weights: (label "method KxN", median time
    of one pass of fd_x86's kernels over those weights at one row, their bytes, calls).
    The step without the engine, the attention or the Python between ops (each call
    still pays ``quantized_linear``'s dispatch: ``call_overhead``). [] without them."""
    import paddle
    from fd_x86.linear import quantized_linear, w4a8_linear

    from fd_core.ops.linear import QuantizedWeight

    quants = [p.data for p in resident_params(model)
              if isinstance(p.data, QuantizedWeight) and len(p.data.qweight.shape) == 2]
    groups: dict[str, list[Any]] = {}
    for q in quants:
        groups.setdefault(f"{q.method} {q.in_features}x{q.out_features}", []).append(q)
    xs = {q.in_features: paddle.ones([1, q.in_features], dtype="float32") for q in quants}
    times: dict[str, list[float]] = {label: [] for label in groups}
    for _ in range(repeats + 1):  # the first pass warms (repacks happened at load)
        for label, qs in groups.items():
            begin = time.perf_counter()
            for q in qs:
                if q.method == "w4a8":
                    w4a8_linear(xs[q.in_features], q)
                else:
                    quantized_linear(xs[q.in_features], q)
            times[label].append(time.perf_counter() - begin)
    return [(label, statistics.median(times[label][1:]), sum(resident_bytes(q) for q in qs), len(qs))
            for label, qs in groups.items()]


def call_overhead(method: str, calls: int = 2000) -> float:
    """Seconds per ``quantized_linear`` call of ``method`` on a 64 x 64 weight at one
    row (fastest of 3 x ``calls``): the Python and op dispatch every kernel call pays."""
    import paddle
    from fd_x86.linear import quantized_linear, w4a8_linear

    from fd_core.quantization.weights import quantize_weight

    # w4a8 takes groups of 128 inputs (its VNNI kernel), the others any width
    width = 128 if method == "w4a8" else 64
    q = quantize_weight(method, np.random.default_rng(0).standard_normal((width, 64)).astype(np.float32), width if method == "w4a8" else 32)
    linear = w4a8_linear if method == "w4a8" else quantized_linear
    x = paddle.ones([1, width], dtype="float32")
    linear(x, q)
    best = float("inf")
    for _ in range(3):
        begin = time.perf_counter()
        for _ in range(calls):
            linear(x, q)
        best = min(best, (time.perf_counter() - begin) / calls)
    return best


def start(llm: LLM, rid: str, prompt: list[int], max_tokens: int) -> None:
    """Add one request and step until it has its first token, plus one warm-up step."""
    engine = llm.engine
    engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    while engine.core.scheduler.num_waiting or any(r.num_output_tokens == 0 for r in engine.core.scheduler.running):
        engine.step()
    engine.step()


def timed_steps(llm: LLM, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        llm.engine.step()
        times.append(time.perf_counter() - begin)
    return times


def finish(llm: LLM) -> None:
    while llm.engine.has_unfinished_requests():
        llm.engine.step()


def agreement(llms: dict[str, LLM], prompts: list[list[int]],
              tokens: int) -> tuple[str, dict[str, tuple[float, float, float]]]:
    """(the reference: fp32, else the first config; per config (fraction of prompts whose
    ``tokens`` greedy tokens all equal the reference's, mean fraction equal before the
    first divergence, mean |logprob difference| on the reference's tokens))."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    outs = {name: [list(o.outputs[0].token_ids) for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)] for name, llm in llms.items()}
    ref = "fp32" if "fp32" in outs else next(iter(outs))

    def prefix(a: list[int], b: list[int]) -> float:
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return n / max(1, len(b))

    scored = [p + s for p, s in zip(prompts, outs[ref])]
    lps = {name: scored_logprobs(llm, scored, [len(p) for p in prompts]) for name, llm in llms.items()}
    return ref, {name: (sum(a == b for a, b in zip(seqs, outs[ref])) / len(prompts),
                        statistics.mean(prefix(a, b) for a, b in zip(seqs, outs[ref])),
                        float(np.mean(np.abs(lps[name] - lps[ref]))))
                 for name, seqs in outs.items()}


def scored_logprobs(llm: LLM, sequences: list[list[int]], starts: list[int]) -> np.ndarray:
    """Logprobs of ``sequences``' own tokens from position ``starts[i]`` on, teacher-forced, concatenated."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
    values = []
    for out, seq, begin in zip(outs, sequences, starts):
        for pos in range(begin, len(seq)):
            values.append(out.prompt_logprobs[pos][seq[pos]].logprob)
    return np.array(values, dtype=np.float64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a checkpoint directory (default: the generated 0.3B)")
    ap.add_argument("--backend", default="x86")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--lm-head", choices=["same", "float", "int8"], default="same")
    ap.add_argument("--group-size", type=int, default=128, help="int4 scale group (-1: per channel)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens before the timed steps")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed per configuration and round")
    ap.add_argument("--probe-mib", type=int, default=1024, help="buffer the bandwidth probe reads")
    ap.add_argument("--kernels", action="store_true",
                    help="also time fd_x86's kernels alone over the quantized weights at one row (x86)")
    ap.add_argument("--agree-prompts", type=int, default=8)
    ap.add_argument("--agree-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    names = [c for c in args.configs.split(",") if c]
    heads = {n: n.partition(":")[2] or args.lm_head for n in names}
    unknown = [c for c in names if c.partition(":")[0] not in CONFIGS or heads[c] not in ("same", "float", "int8")]
    if unknown or not names:
        ap.error(f"--configs takes a comma list of {', '.join(CONFIGS)} (each optionally :same, :float or :int8 "
                 f"for its LM head); got {args.configs!r}")
    path = Path(args.model) if args.model else CHECKPOINT
    if not (path / "config.json").is_file():
        generate_checkpoint(path, "0.3b", naming="paddle")
    from fd_core.backends.cpu import num_threads

    threads = num_threads()
    print(f"CPU: {cpu_model()}; {threads} threads; backend {args.backend}; LM head {args.lm_head}; "
          f"B=1 after a {args.prompt}-token prompt; {args.rounds} rounds x {args.steps} steps, interleaved", flush=True)
    llms = {}
    for name in names:
        # quantized configurations keep the rest (norms, embeddings, a float head) in
        # --dtype auto, as a user gets it (bf16 where the checkpoint and backend have it)
        config = name.partition(":")[0]
        dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(config, "auto")
        llms[name] = LLM(str(path), backend=args.backend, dtype=dtype, kv_cache_dtype="float32",
                         quantization=quantization(config, heads[name], args.group_size), max_model_len=1024,
                         max_num_seqs=max(1, args.agree_prompts), num_gpu_blocks_override=64)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 2000, args.prompt)]
    steps: dict[str, list[float]] = {n: [] for n in names}
    reads: list[float] = []
    probe = args.probe_mib << 20
    for name, llm in llms.items():  # first-use costs: op builds, weight repacks
        start(llm, f"warm-{name}", prompt[:16], 3)
        finish(llm)
    for name, llm in llms.items():
        start(llm, f"timed-{name}", prompt, args.rounds * args.steps + 4)
    for _ in range(args.rounds):
        for name, llm in llms.items():
            steps[name] += timed_steps(llm, args.steps)
        reads.append(read_seconds(probe, threads, repeats=3))
    for llm in llms.values():
        finish(llm)
    kernels = {n: kernel_seconds(llm.engine.core.runner.model) for n, llm in llms.items()} if args.kernels else {}
    overheads = {m: call_overhead(m) for m in {label.split()[0] for rows in kernels.values() for label, *_ in rows}}
    bandwidth = probe / statistics.median(reads)
    agree_prompts = [[int(t) for t in rng.integers(100, 2000, int(n))] for n in rng.integers(8, 32, args.agree_prompts)]
    ref, agree = agreement(llms, agree_prompts, args.agree_tokens) if args.agree_prompts > 0 else ("-", {})
    print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s (median of {len(reads)} probes of {args.probe_mib} MiB; "
          f"range {probe / max(reads) / 1e9:.1f}-{probe / min(reads) / 1e9:.1f})")
    print(f"{'config':10} {'step ms':>8} {'tok/s':>7} {'MB read':>8} {'floor ms':>8} {'x floor':>7} "
          f"greedy = {ref} (identical, prefix), mean |dlogprob|")
    for name, llm in llms.items():
        nbytes = step_bytes(llm.engine.core.runner.model)
        step_s = statistics.median(steps[name])
        floor_s = nbytes / bandwidth
        same = f"{agree[name][0]:4.0%} {agree[name][1]:4.0%} {agree[name][2]:.4f}" if name in agree else "-"
        print(f"{name:10} {step_s * 1e3:8.2f} {1 / step_s:7.1f} {nbytes / 1e6:8.1f} {floor_s * 1e3:8.2f} "
              f"{step_s / floor_s:7.2f}   {same}")
    for name, rows in kernels.items():
        if not rows:
            continue
        seconds, nbytes = sum(r[1] for r in rows), sum(r[2] for r in rows)
        calls = sum(overheads[label.split()[0]] * n for label, _, _, n in rows)
        print(f"{name:8} kernels alone: {seconds * 1e3:.2f} ms over {nbytes / 1e6:.1f} MB of quantized weights "
              f"at one row = {seconds * bandwidth / nbytes:.2f}x their floor; less the calls' dispatch "
              f"({calls * 1e3:.2f} ms): {(seconds - calls) * bandwidth / nbytes:.2f}x")
        for label, secs, size, n in rows:
            own = secs - overheads[label.split()[0]] * n
            print(f"  {label:22} x{n:<3d} {secs * 1e3:7.3f} ms {size / 1e6:7.1f} MB {size / secs / 1e9:6.1f} GB/s "
                  f"x floor {secs * bandwidth / size:5.2f} (less dispatch {own * bandwidth / size:5.2f})")
    if overheads:
        print("dispatch per quantized_linear call (64 x 64 weight, one row): "
              + ", ".join(f"{m} {s * 1e6:.1f} us" for m, s in sorted(overheads.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
