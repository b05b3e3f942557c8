"""fd-core's side of ``benchmarks/real_size.py``, run as its own process.

    python benchmarks/real_size_fd.py --checkpoint DIR --out result.json --quantization wint4 ...

Loads the checkpoint with ``fd_core.LLM`` (timed: model build, weight
loading with quantize-on-load, KV cache), writes ``<out>.loaded`` with the
load time and its own ``/proc/self/status`` figures (VmHWM: the exact peak
during the load), waits ``--settle`` seconds (so the watching parent sees the
loaded state before anything else runs), then measures what
``benchmarks/llama_cpp_fdcore.py`` measures (decode tok/s at each batch,
prefill tok/s, greedy tokens after each prompt of ``--prompts``) and writes
everything to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="result JSON (and <out>.loaded once loaded)")
    p.add_argument("--quantization", default="wint4")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--backend", default="x86")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--greedy-tokens", type=int, default=8)
    p.add_argument("--prompts", type=Path, default=None, help="JSON list of token-id prompts for greedy tokens")
    p.add_argument("--settle", type=float, default=1.0, help="seconds to idle after the load")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["FD_CPU_NUM_THREADS"] = str(args.threads)  # before fd_core is imported: read once
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import llama_cpp_fdcore as fdc
    from quant_decode import Config, finish, start
    from real_size_proc import parse_status

    from fd_core import LLM

    max_len = max(args.prefill_len, args.prompt_len + args.steps + 8, 64) + 64
    max_batch = max(args.batch)
    blocks_per_seq = -(-(max_len + 16) // 64) + 1  # as llama_cpp_fdcore.load
    begin = time.perf_counter()
    llm = LLM(str(args.checkpoint), backend=args.backend, max_model_len=max_len, max_num_seqs=max_batch,
              max_num_batched_tokens=max(2048, max_len), num_gpu_blocks_override=max_batch * blocks_per_seq + 16,
              enable_prefix_caching=False, quantization=args.quantization, dtype=args.dtype)
    load_s = time.perf_counter() - begin
    loaded = {"load_s": load_s, "status": parse_status(Path("/proc/self/status").read_text())}
    args.out.with_name(args.out.name + ".loaded").write_text(json.dumps(loaded) + "\n")
    time.sleep(args.settle)

    row = fdc.FdRow(f"fd-core {args.backend} {args.quantization}", Config(args.backend, args.quantization, llm))
    start(row.config, 2, 16, 4)  # first-use costs (as llama_cpp_fdcore.load)
    finish(row.config)
    fdc.measure_decode(row, args.batch, args.prompt_len, args.steps)
    fdc.measure_prefill(row, args.prefill_len, 0)
    prompts = json.loads(args.prompts.read_text()) if args.prompts else []
    tokens = fdc.greedy_tokens(row, prompts, args.greedy_tokens) if prompts else []
    result = {**loaded, "backend": args.backend, "quantization": args.quantization,
              "decode": {str(b): v[-1] for b, v in row.decode.items()}, "prefill": row.prefill[-1],
              "greedy": tokens, "final_status": parse_status(Path("/proc/self/status").read_text())}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
