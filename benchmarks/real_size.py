"""ERNIE-4.5-21B-A3B on one CPU machine: fd-core ``--quantization wint4`` against llama.cpp Q4_0, in one run.

    python benchmarks/real_size.py                     # the real shape: ~44 GB bf16 + GGUFs under --dir
    python benchmarks/real_size.py --quick             # the same pipeline on tiny-moe (seconds to a minute)
    python benchmarks/real_size.py --layers 4          # the 21B's widths, 4 layers (~5.5 GB bf16): minutes
    python benchmarks/real_size.py --llama-cpp ~/src/llama.cpp --dir /data/ernie21b

A benchmark, never CI. Steps (each skipped when its output is already there):

1. llama.cpp found or built (``llama_cpp_build.find_or_build``, as
   ``benchmarks/llama_cpp.py``).
2. The real 21B-A3B shape (``fd_core.testing.checkpoints.SHAPES["21b-a3b"]``)
   in bf16, seeded random weights, PyTorch layout (the files of
   ``baidu/ERNIE-4.5-21B-A3B-PT``, which llama.cpp's converter reads),
   9 shards of ~5.4 GB written tensor by tensor
   (``fd_core.testing.streamed_checkpoints``): ``--dir``/bf16.
3. ``convert_hf_to_gguf.py --outtype q8_0`` (23 GB).
4. fd-core, in its own process (``real_size_fd.py``), loads the bf16 files
   with ``--quantization wint4`` (FastDeploy's rule on ERNIE: routed experts
   int4, every other linear int8, LM head float) on ``--backend``: load time,
   peak RssAnon / RssFile (sampled every 50 ms) and VmHWM (exact) during the
   load, the resident size after it; decode tok/s at each ``--batch``,
   prefill tok/s, greedy tokens.
5. ``llama-quantize --allow-requantize`` Q8_0 -> Q4_0 (12 GB; why via Q8_0:
   ``real_size_llama``), then the Q8_0 file is deleted. When the disk cannot
   hold the bf16 files, Q8_0 and Q4_0 at once (~80 GB), the bf16 files are
   deleted first (``--keep-bf16`` stops instead); a rerun regenerates them.
6. llama.cpp: llama-server on Q4_0 watched the same way (load time and
   memory until ``/health``; greedy tokens), llama-batched-bench (decode),
   llama-bench (prefill).

Disk: 44 GB (bf16) + 23 GB (Q8_0), then 12 GB (Q4_0): 67 GB at the peak when
the bf16 files go first, 79 GB when kept. RAM: fd-core holds ~12 GB resident,
llama.cpp maps its 12 GB file; they never run at the same time.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

GIB = 1 << 30
DEFAULT_DIR = Path.home() / ".cache" / "fd_core" / "ernie21b"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="checkpoint and GGUF files (never the repo)")
    p.add_argument("--quick", action="store_true", help="tiny-moe instead of 21b-a3b, under --dir/quick")
    p.add_argument("--layers", type=int, default=None,
                   help="the 21B's widths with only this many layers (1 dense + the rest MoE; 2-28), under "
                        "--dir/layersN: a proxy that converts and loads in minutes")
    p.add_argument("--threads", type=int, default=2, help="threads on both sides")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--prefill-len", type=int, default=512)
    # 32: 8 steps at B=1 (~0.4 s) gave 25.0 tok/s once where three runs of 32 gave 17.4-18.5
    p.add_argument("--steps", type=int, default=32, help="fd-core timed decode steps per batch")
    p.add_argument("--decode-tokens", type=int, default=32, help="llama-batched-bench -ntg")
    p.add_argument("--greedy-tokens", type=int, default=8)
    p.add_argument("--greedy-prompts", type=int, default=2)
    p.add_argument("--backend", default="x86")
    p.add_argument("--quantization", default="wint4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-bf16", action="store_true", help="stop rather than delete the bf16 files for disk")
    p.add_argument("--reuse-fd", action="store_true",
                   help="take fd-core's figures from --dir/fd-core.json of an earlier run cut short after its "
                        "fd-core side (the table says so) instead of measuring again")
    p.add_argument("--llama-cpp", type=Path, default=None, help="an existing llama.cpp tree or build dir")
    p.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    args = p.parse_args(argv)
    for name in ("threads", "prompt_len", "prefill_len", "steps", "decode_tokens", "greedy_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(b < 1 for b in args.batch):
        p.error(f"--batch sizes must be >= 1, got {args.batch}")
    args.dir = args.dir.expanduser().resolve()
    if args.dir == ROOT or ROOT in args.dir.parents:
        p.error(f"--dir {args.dir} is inside the repository; the files are ~80 GB: use a cache directory")
    args.shape = "tiny-moe" if args.quick else "21b-a3b"
    args.overrides = {}
    if args.layers is not None:
        if args.quick:
            p.error("--layers takes the 21B's widths; it does not go with --quick")
        if not 2 <= args.layers <= 28:
            p.error(f"--layers must be 2..28 (1 dense layer + at least one MoE layer), got {args.layers}")
        if args.layers < 28:
            args.overrides = {"num_hidden_layers": args.layers, "moe_layer_end_index": args.layers - 1}
            args.dir = args.dir / f"layers{args.layers}"
    if args.quick:
        args.dir = args.dir / "quick"
        args.prompt_len, args.prefill_len, args.decode_tokens = min(args.prompt_len, 32), min(args.prefill_len, 64), 8
    return args


def watch_fd(args: argparse.Namespace, checkpoint: Path, prompts: list[list[int]]) -> dict[str, Any]:
    """fd-core's figures, from ``real_size_fd.py`` in a watched process."""
    from real_size_proc import Watched

    out = args.dir / "fd-core.json"
    for stale in (out, out.with_name(out.name + ".loaded")):
        stale.unlink(missing_ok=True)
    (args.dir / "prompts.json").write_text(json.dumps(prompts))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "real_size_fd.py"), "--checkpoint", str(checkpoint),
           "--out", str(out), "--quantization", args.quantization, "--backend", args.backend,
           "--threads", str(args.threads), "--batch", *map(str, args.batch), "--prompt-len", str(args.prompt_len),
           "--prefill-len", str(args.prefill_len), "--steps", str(args.steps),
           "--greedy-tokens", str(args.greedy_tokens), "--prompts", str(args.dir / "prompts.json")]
    watched = Watched(cmd, args.dir / "fd-core.log")
    loaded_file = out.with_name(out.name + ".loaded")
    load_mem = None
    while watched.proc.poll() is None:
        if load_mem is None and loaded_file.is_file():
            load_mem = watched.mark()  # the child idles for a second after writing it
            print(f"  fd-core loaded: {json.loads(loaded_file.read_text())['load_s']:.0f} s", flush=True)
        time.sleep(0.05)
    code = watched.wait()
    if code != 0 or not out.is_file():
        tail = "\n".join(watched.log_text().splitlines()[-25:])
        raise RuntimeError(f"fd-core's run failed (exit {code}); log {watched.log}:\n{tail}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["mem"] = vars(load_mem) if load_mem is not None else None
    out.write_text(json.dumps(result, indent=1) + "\n")  # with the sampled peaks: --reuse-fd reads them back
    return result


def mem_cells(load_s: float, mem: Any, hwm: int) -> list[str]:
    """Load-time and memory cells: load s, peak anon / file, VmHWM, resident after the load, peak / resident."""
    from real_size_proc import MemSample

    mem = MemSample(**mem) if isinstance(mem, dict) else mem
    if mem is None:  # an earlier run that kept only the child's own figures (no sampled peaks)
        return [f"{load_s:.1f} s", "not sampled", f"{hwm / GIB:.2f}", "(see VmHWM)", ""]
    resident = mem.rss_anon + mem.rss_file
    return [f"{load_s:.1f} s", f"{mem.peak_anon / GIB:.2f} / {mem.peak_file / GIB:.2f}", f"{hwm / GIB:.2f}",
            f"{mem.rss_anon / GIB:.2f} + {mem.rss_file / GIB:.2f}", f"{hwm / max(resident, 1):.2f}x"]


PIECES = 2048  # fd_core.testing.checkpoints' trained tokenizer pieces; the rest of the vocab is padding


def padding_ids(tokens: list[list[int]]) -> int:
    """How many of ``tokens`` are padding-row ids (>= PIECES)."""
    return sum(t >= PIECES for row in tokens for t in row)


def report(args: argparse.Namespace, fd: dict[str, Any], lc: dict[str, Any], info: dict[str, Any]) -> str:
    """The markdown tables and the greedy verdict."""
    from llama_cpp import agreement, cell

    head = ["", "load", "peak RssAnon / RssFile during load, GiB", "VmHWM, GiB", "resident after load "
            "(anon + file), GiB", "VmHWM / resident"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    # a --reuse-fd run's own configuration (saved with its figures), else this run's
    name = f"fd-core {fd.get('backend', args.backend)} {fd.get('quantization', args.quantization)}"
    fd_label = name + (" (--reuse-fd: an earlier run's)" if fd.get("reused") else "")
    lines.append(f"| {fd_label} | " + " | ".join(mem_cells(fd["load_s"], fd.get("mem"), fd["status"]["VmHWM"]))
                 + " |")
    lines.append("| llama.cpp Q4_0 | " + " | ".join(mem_cells(lc["load_s"], lc["mem"], lc["mem"].hwm)) + " |")
    head = [f"{args.shape} decode tok/s", *(f"B={b}" for b in args.batch), f"prefill, one {args.prefill_len}-token "
            "prompt"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines.append("| llama.cpp Q4_0 | " + " | ".join([cell(lc["decode"][b]) for b in args.batch]
                                                    + [cell(lc["prefill"])]) + " |")
    lines.append(f"| {name} | " + " | ".join([cell(fd["decode"][str(b)], lc["decode"][b]) for b in args.batch]
                                             + [cell(fd["prefill"], lc["prefill"])]) + " |")
    lines += ["", f"greedy, {args.greedy_tokens} tokens x {len(fd['greedy'])} prompts: {name} vs llama.cpp "
              f"Q4_0: {agreement(fd['greedy'], lc['greedy'])}",
              f"  fd-core {fd['greedy']}", f"  llama.cpp {lc['greedy']}",
              f"  ids >= {PIECES} (rows past the generated tokenizer's pieces: they win wherever the final "
              f"hidden state's dimension 0 is negative, in any implementation; benchmarks/moe_oracle.py): "
              f"fd-core {padding_ids(fd['greedy'])}, llama.cpp {padding_ids(lc['greedy'])}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import llama_cpp_runs as lcr
    import numpy as np
    from llama_cpp import machine
    from llama_cpp_build import find_or_build
    from real_size_llama import ensure_free, q8_0_then_q4_0, serve

    from fd_core.testing.checkpoints import SHAPES, _nbytes, pytorch_tensor_specs
    from fd_core.testing.streamed_checkpoints import MARKER, generate_streamed_checkpoint

    t0 = time.perf_counter()
    llama = find_or_build(llama_cpp=args.llama_cpp)
    specs = pytorch_tensor_specs({**SHAPES[args.shape], **args.overrides})
    params = sum(math.prod(s.shape) for s in specs)
    bf16 = args.dir / "bf16"
    reuse = args.reuse_fd and (args.dir / "fd-core.json").is_file()
    gguf_made = any((args.dir / f"model-{q}.gguf").is_file() for q in ("q8_0", "q4_0"))
    if not (bf16 / MARKER).is_file() and not (reuse and gguf_made):
        # fd-core loads these files; llama.cpp's converter too
        ensure_free(args.dir, sum(_nbytes(s) for s in specs) + GIB, "the bf16 checkpoint")
        print(f"[{time.perf_counter() - t0:.0f} s] bf16 checkpoint {bf16} ({params / 1e9:.2f} B params)", flush=True)
        generate_streamed_checkpoint(bf16, args.shape, seed=args.seed, shard_bytes=(5 << 30) if not args.quick
                                     else 1 << 20, log=lambda s: print(s, flush=True), **args.overrides)
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(100, 2000, 16 * (i + 1))] for i in range(args.greedy_prompts)]
    fd: dict[str, Any] = {}

    def fd_side() -> None:
        print(f"[{time.perf_counter() - t0:.0f} s] fd-core {args.backend} {args.quantization}", flush=True)
        saved = args.dir / "fd-core.json"
        if args.reuse_fd and saved.is_file():
            print(f"  --reuse-fd: fd-core figures from {saved} (written {time.ctime(saved.stat().st_mtime)})")
            fd.update(json.loads(saved.read_text()), reused=True)
        else:
            fd.update(watch_fd(args, bf16, prompts))
        q4_need = int(params * 18 / 32) + 6 * GIB  # a margin: the disk may be shared
        if shutil.disk_usage(args.dir).free < q4_need and not args.keep_bf16:
            print(f"  deleting {bf16} to make room for Q4_0 ({q4_need / 1e9:.0f} GB needed; a rerun "
                  "regenerates it)", flush=True)
            shutil.rmtree(bf16)

    print(f"[{time.perf_counter() - t0:.0f} s] llama.cpp GGUF (Q8_0, then Q4_0)", flush=True)
    q4 = q8_0_then_q4_0(llama, bf16, args.dir, args.threads, params, fd_side)
    print(f"[{time.perf_counter() - t0:.0f} s] llama.cpp Q4_0: load, greedy, decode, prefill", flush=True)
    lc = serve(llama, q4, prompts, args.greedy_tokens, args.threads, args.dir / "llama-server.log")
    lc["decode"] = lcr.batched_decode(llama, q4, args.batch, args.prompt_len, args.decode_tokens, args.threads)
    lc["prefill"] = lcr.prefill(llama, q4, args.prefill_len, args.threads)
    info = machine(args.threads)
    print(f"\nCPU: {info['cpu']} ({' '.join(info['isa'])}); {info['cores']} cores, {args.threads} threads on both "
          f"sides; read bandwidth {info['read_gb_s']:.1f} GB/s; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in info['loadavg'])}; whole run {time.perf_counter() - t0:.0f} s")
    print(f"llama.cpp: {llama.origin}, commit {llama.commit()}; Q4_0 made by llama-quantize --allow-requantize from "
          "the converter's Q8_0 (convert_hf_to_gguf.py writes no Q4_0, and an f32/bf16 GGUF would need 44-87 GB "
          "more disk)")
    shape = args.shape + (f" widths, {args.layers} layers (--layers)" if args.overrides else "")
    print(f"{shape}: {params / 1e9:.2f} B params, seeded random bf16 weights (PyTorch layout); fd-core decode: "
          f"B x {args.steps} engine steps after {args.prompt_len}-token prompts; llama.cpp: llama-batched-bench, "
          f"{args.decode_tokens} tokens; one round each\n")
    if args.json is not None:  # first: the figures survive a failing report
        args.json.write_text(json.dumps({"machine": info, "fd": fd, "llama": {**lc, "mem": lc["mem"].as_gib()},
                                         "args": {k: str(v) for k, v in vars(args).items()}}, indent=1) + "\n")
    print(report(args, fd, lc, info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
