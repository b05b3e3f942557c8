"""llama.cpp's side of ``benchmarks/real_size.py``: the GGUF files, the load and the greedy tokens.

- ``q8_0_then_q4_0``: llama.cpp's own converter (``convert_hf_to_gguf.py
  --outtype q8_0``) from the bf16 safetensors, then ``llama-quantize
  --allow-requantize`` to Q4_0. The converter cannot write Q4_0 itself, and
  its f32/bf16/f16 outputs would need another 42-87 GB of disk next to the
  bf16 checkpoint; Q8_0 as the intermediate costs 23 GB and a second
  rounding (Q8_0's error is ~1/16 of Q4_0's step: what reaches Q4_0 is the
  same but for rare ties). ``before_quantize`` runs between the two steps
  (the benchmark measures fd-core there, then may free the bf16 files).
- ``serve``: ``llama-server`` on the Q4_0 file, watched for memory
  (``real_size_proc.Watched``) from its start until ``/health`` answers:
  load time, peak RssAnon / RssFile, VmHWM, resident size; then greedy
  tokens through ``/completion`` (temperature 0, top_k 1) from the same
  server.
Decode and prefill rates come from ``llama_cpp_runs`` (llama-batched-bench,
llama-bench), as in ``benchmarks/llama_cpp.py``.
"""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llama_cpp_build import LlamaCpp, _run_logged, convert
from llama_cpp_runs import _free_port, _post
from real_size_proc import Watched

__all__ = ["ensure_free", "q8_0_then_q4_0", "serve"]


def ensure_free(path: Path, need: int, what: str) -> None:
    """Stop (SystemExit) with a clear message when ``path``'s disk has less than ``need`` bytes free."""
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free
    if free < need:
        raise SystemExit(f"not enough disk for {what}: {need / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free "
                         f"under {path}; free some space or pass another --dir")


def q8_0_then_q4_0(llama: LlamaCpp, checkpoint: Path, out_dir: Path, threads: int, params: int,
                   before_quantize: Callable[[], None], keep_q8_0: bool = False) -> Path:
    """``out_dir/model-q4_0.gguf`` from ``checkpoint`` via Q8_0 (each step skipped when its output exists)."""
    q4 = out_dir / "model-q4_0.gguf"
    q8 = out_dir / "model-q8_0.gguf"
    if not q4.is_file() and not q8.is_file():
        ensure_free(out_dir, int(params * 34 / 32) + (1 << 30), "the Q8_0 GGUF (34 bytes per 32 weights)")
        begin = time.perf_counter()
        convert(llama, checkpoint, q8, "q8_0")
        print(f"  convert_hf_to_gguf.py --outtype q8_0: {time.perf_counter() - begin:.0f} s", flush=True)
    before_quantize()
    if not q4.is_file():
        ensure_free(out_dir, int(params * 18 / 32) + (1 << 30), "the Q4_0 GGUF (18 bytes per 32 weights)")
        begin = time.perf_counter()
        partial = q4.with_suffix(".partial")
        _run_logged([str(llama.tool("llama-quantize")), "--allow-requantize", str(q8), str(partial), "Q4_0",
                     str(threads)], q4.with_suffix(".quantize.log"))
        partial.rename(q4)
        print(f"  llama-quantize --allow-requantize Q8_0 -> Q4_0: {time.perf_counter() - begin:.0f} s", flush=True)
    if q8.is_file() and not keep_q8_0:
        q8.unlink()
    return q4


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def serve(llama: LlamaCpp, gguf: Path, prompts: Sequence[Sequence[int]], tokens: int, threads: int, log: Path,
          timeout: float = 900.0) -> dict[str, Any]:
    """Load ``gguf`` in a llama-server watched for memory; its greedy tokens after each prompt."""
    port = _free_port()
    ctx = max([len(p) for p in prompts] + [64]) + tokens + 64
    watched = Watched([str(llama.tool("llama-server")), "-m", str(gguf), "-t", str(threads), "-c", str(ctx),
                       "-np", "1", "--host", "127.0.0.1", "--port", str(port), "--no-webui"], log)
    base = f"http://127.0.0.1:{port}"
    try:
        while not _ready(base):
            if watched.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({watched.proc.returncode}) before it was ready; log {log}")
            if time.perf_counter() - watched.started > timeout:
                raise TimeoutError(f"llama-server not ready after {timeout:.0f} s; log {log}")
            time.sleep(0.05)
        load_s = time.perf_counter() - watched.started
        loaded = watched.mark()
        outs = []
        for prompt in prompts:
            body = {"prompt": [int(t) for t in prompt], "n_predict": tokens, "temperature": 0.0, "top_k": 1,
                    "ignore_eos": True, "cache_prompt": False, "return_tokens": True}
            reply = _post(f"{base}/completion", body, timeout)
            outs.append([int(t) for t in reply["tokens"]])  # type: ignore[attr-defined]
        return {"load_s": load_s, "mem": loaded, "greedy": outs}
    finally:
        watched.stop()
