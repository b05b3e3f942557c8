"""fd-core against HF transformers ``generate`` on the same checkpoint, in one run.

1. Builds the workload: ``--num-prompts`` token-id prompts, input lengths
   uniform in ``--input-len MIN MAX``, output lengths in ``--output-len MIN
   MAX``, Poisson arrivals at ``--request-rate`` (seeded).
2. HF baseline: CPU torch fp32, arrival-driven static batches of the requests
   that have arrived, each run to its longest output (see
   ``fd_core.benchmarks.compare`` for exactly what is timed).
3. fd-core: ``fd-serve --backend cpu`` in a subprocess on the same checkpoint,
   the same requests at the same offsets over streaming /v1/completions.
4. Prints both sides' serving metrics and the fd-core / HF ratios, plus how
   many requests' greedy tokens agree (a check that both ran the same model).
5. Engine decode step vs the matmul-only ceiling: the in-process engine
   (``LLM``, ``--ceiling-backend``, default auto) decoding B requests of ``--ceiling-prompt-len``
   tokens; the wall time of ``engine.step()`` against just the matmuls of one
   decode step at batch B in paddle (``benchmarks/decode_step.py``'s
   ``MatmulCeiling``), alternating, medians of ``--ceiling-repeats`` runs.

The checkpoint needs the pytorch naming (HF loads it; fd-core loads both); by
default the 0.3B shape is generated once into ``checkpoints/``.

    python benchmarks/compare.py                             # 64 requests at 1 req/s, B = 1, 8, 32
    python benchmarks/compare.py --num-prompts 16 --skip-ceiling
    python benchmarks/compare.py --skip-hf --skip-serve      # only the decode-step ceiling

Timings on a shared machine are noisy; the ratios of one run are what to read.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fd_core.benchmarks.cli import save_result  # noqa: E402
from fd_core.benchmarks.compare import (  # noqa: E402
    ServerProcess,
    build_workload,
    compare_table,
    run_hf,
    run_server,
    usable_cores,
)
from fd_core.benchmarks.metrics import compute_metrics, format_serving_table  # noqa: E402

CHECKPOINT = ROOT / "checkpoints" / "ernie-4.5-0.3b-pt"
PERCENTILES = (50.0, 90.0, 99.0)


def checkpoint(path: str | None) -> Path:
    if path:
        return Path(path)
    if not (CHECKPOINT / "model.safetensors").is_file():
        from fd_core.testing.checkpoints import generate_checkpoint

        print(f"generating {CHECKPOINT} (once)", flush=True)
        generate_checkpoint(CHECKPOINT, "0.3b", naming="pytorch")
    return CHECKPOINT


def text_agreement(hf: list[Any], fd: list[Any], chars: int) -> tuple[int, int, int]:
    """(requests whose whole greedy text agrees, whose first ``chars`` characters agree, compared)."""
    whole = start = compared = 0
    for a, b in zip(hf, fd):
        if a.success and b.success:
            compared += 1
            whole += a.generated_text == b.generated_text
            start += a.generated_text[:chars] == b.generated_text[:chars]
    return whole, start, compared


def decode_vs_ceiling(model: Path, batches: list[int], prompt_len: int, steps: int,
                      repeats: int, backend: str = "auto", quantization: str | None = None) -> list[dict[str, float]]:
    """Engine decode step (wall of engine.step()) vs the matmul-only step, per batch size."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from decode_step import MatmulCeiling

    from fd_core import LLM, SamplingParams

    max_len = prompt_len + steps * (repeats + 1) + 8
    blocks = -(-max_len // 64) * max(batches) + 2
    llm = LLM(str(model), backend=backend, quantization=quantization, max_num_seqs=max(batches),
              max_model_len=max(max_len, 1024), num_gpu_blocks_override=blocks, enable_prefix_caching=False)
    engine = llm.engine
    print(f"  backend {engine.core.backend.name}, {quantization or 'fp32'}", flush=True)
    ceiling = MatmulCeiling(engine.core.runner.config)
    import numpy as np

    rng = np.random.default_rng(0)
    vocab = engine.core.model_config.vocab_size
    rows = []
    for b in batches:
        ids = [f"ceil{b}-{i}" for i in range(b)]
        params = SamplingParams(max_tokens=steps * (repeats + 1) + 4, ignore_eos=True, temperature=0.0)
        for rid in ids:
            engine.add_request(rid, rng.integers(100, vocab, size=prompt_len).tolist(), params)
        while True:  # prefill, until a step is decodes only
            engine.step()
            s = engine.core.last_step
            if s.num_prefill_tokens == 0 and s.num_decodes == b:
                break
        for _ in range(2):
            engine.step()  # warm-up
        walls, cores, forwards, ceils = [], [], [], []
        for _ in range(repeats):
            start = time.perf_counter()
            core = forward = 0.0
            for _ in range(steps):
                engine.step()
                core += engine.core.last_step.step_seconds
                forward += engine.core.last_step.forward_seconds
            walls.append((time.perf_counter() - start) / steps * 1e3)
            cores.append(core / steps * 1e3)
            forwards.append(forward / steps * 1e3)
            ceils.append(ceiling.time(b, steps))
        for rid in ids:
            engine.abort_request(rid)
        while engine.has_unfinished_requests():
            engine.step()
        row = {"batch": b, "step_ms": statistics.median(walls), "core_step_ms": statistics.median(cores),
               "forward_ms": statistics.median(forwards), "ceiling_ms": statistics.median(ceils)}
        row["ratio"] = row["step_ms"] / row["ceiling_ms"]
        print(f"  B={b:3d}: engine step {row['step_ms']:7.1f} ms (core {row['core_step_ms']:.1f}, forward "
              f"{row['forward_ms']:.1f}) | matmul-only {row['ceiling_ms']:7.1f} ms | ratio {row['ratio']:.2f}",
              flush=True)
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a pytorch-naming checkpoint (default: the 0.3B shape under checkpoints/)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=1.0, help="requests/s, Poisson; inf: all at once")
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--input-len", type=int, nargs=2, default=[64, 512], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[32, 256], metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: usable cores)")
    p.add_argument("--hf-max-batch", type=int, default=64, help="largest HF static batch")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--serve-args", default="", help="extra fd-serve flags, one string")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-serve", action="store_true")
    p.add_argument("--skip-ceiling", action="store_true")
    p.add_argument("--ceiling-batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--ceiling-prompt-len", type=int, default=128)
    p.add_argument("--ceiling-steps", type=int, default=8)
    p.add_argument("--ceiling-repeats", type=int, default=5)
    p.add_argument("--ceiling-backend", default="auto",
                   help="backend of the decode-step measurement (default auto: fd_x86 when installed)")
    p.add_argument("--ceiling-quantization", default=None, help="e.g. wint8 (the ceiling stays fp32 matmuls)")
    p.add_argument("--result-dir", default="benchmarks/results")
    args = p.parse_args()

    model = checkpoint(args.model)
    config = json.loads((model / "config.json").read_text())
    workload = build_workload(args.num_prompts, args.request_rate, config["vocab_size"], tuple(args.input_len),
                              tuple(args.output_len), args.seed, args.burstiness)
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    result: dict[str, Any] = {
        "date": date, "kind": "compare", "machine": f"{platform.node()} {platform.processor() or platform.machine()}"
        f", {usable_cores()} usable cores", "config": vars(args) | {"model": str(model)},
        "workload": {"input_tokens": sum(map(len, workload.prompts)), "output_tokens": sum(workload.output_lens),
                     "last_arrival_s": workload.arrivals[-1]},
    }
    print(f"workload: {len(workload)} requests, {result['workload']['input_tokens']} input / "
          f"{result['workload']['output_tokens']} output tokens, arrivals over "
          f"{workload.arrivals[-1]:.1f} s; machine: {result['machine']}", flush=True)
    metrics = {}
    records = {}
    if not args.skip_hf:
        print("HF transformers generate (CPU torch fp32, static batches):", flush=True)
        from fd_core.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_pretrained(model)
        recs, duration, batches = run_hf(model, workload, args.threads, args.hf_max_batch,
                                         decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                                         log=lambda m: print(m, flush=True))
        gc.collect()
        metrics["hf"], records["hf"] = compute_metrics(recs, duration, PERCENTILES), recs
        result["hf"] = {"summary": metrics["hf"].to_dict(), "batches": batches}
        print(format_serving_table(metrics["hf"], {"Side": "HF generate"}), flush=True)
    if not args.skip_serve:
        serve_args = ["--backend", "cpu", "--max-num-seqs", str(args.max_num_seqs),
                      "--max-model-len", str(max(args.input_len[1] + args.output_len[1], 1024)),
                      "--num-gpu-blocks-override",
                      str(args.max_num_seqs * -(-(args.input_len[1] + args.output_len[1]) // 64) + 2),
                      "--disable-log-requests", *args.serve_args.split()]
        log = ROOT / args.result_dir / f"compare-serve-{date}.log"
        print(f"fd-core: fd-serve {' '.join(serve_args)} (log: {log})", flush=True)
        with ServerProcess(model, serve_args, log) as server:
            recs, duration = run_server(server.url, str(model), workload)
        metrics["fd"], records["fd"] = compute_metrics(recs, duration, PERCENTILES), recs
        result["fd"] = {"summary": metrics["fd"].to_dict(), "serve_args": serve_args}
        print(format_serving_table(metrics["fd"], {"Side": "fd-core (fd-serve)"}), flush=True)
        failed = [r.error for r in recs if not r.success]
        if failed:
            print(f"{len(failed)} fd-core request(s) failed; first error: {failed[0]}")
    if "hf" in metrics and "fd" in metrics:
        table, ratios = compare_table(metrics["hf"], metrics["fd"])
        whole, start, compared = text_agreement(records["hf"], records["fd"], 32)
        print(table)
        print(f"greedy agreement (same model on both sides): {whole}/{compared} requests' whole texts and "
              f"{start}/{compared} first 32 characters are identical")
        result["ratios"] = ratios
        result["greedy_agreement"] = {"whole": whole, "first_32_chars": start, "compared": compared}
    if not args.skip_ceiling:
        print(f"engine decode step vs matmul-only ceiling (prompt {args.ceiling_prompt_len} tokens):", flush=True)
        result["ceiling"] = decode_vs_ceiling(model, args.ceiling_batch, args.ceiling_prompt_len,
                                              args.ceiling_steps, args.ceiling_repeats, args.ceiling_backend,
                                              args.ceiling_quantization)
        print("\n  B | engine step ms | matmul-only ms | ratio")
        for r in result["ceiling"]:
            print(f"{r['batch']:3d} | {r['step_ms']:14.1f} | {r['ceiling_ms']:14.1f} | {r['ratio']:.2f}")
    path = save_result(result, str(ROOT / args.result_dir), f"compare-{date}.json")
    print(f"result written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
