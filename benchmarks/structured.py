"""Structured output's cost: decode throughput with every request constrained vs none.

For each batch size B (default 1, 8, 32), on the ERNIE-4.5-0.3B shape
(generated once under ``checkpoints/``; random weights) with ``--backend``
(default x86) and ``--quantization`` (default wint8): the offline ``LLM``
generates B requests of ``--tokens`` output tokens, unconstrained, then the
same B requests each under a JSON schema (an object with one string of at
least 4096 characters, so no request ends early; ``min_tokens`` keeps the
unconstrained ones going too), alternating ``--repeats`` times; prints
output tokens/s of both and the ratio unconstrained / constrained (target at
B=8: <= 1.15), and the process's CPU time per output token of both (all
threads; on a shared machine less noisy than the wall clock). Then the compile time per schema of the test set
(``tests/structured/schemas.py``) on the model's vocabulary.

    python benchmarks/structured.py                       # B = 1, 8, 32
    python benchmarks/structured.py --batch 8 --tokens 32 --repeats 2

Timings on a shared machine are noisy; read the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402

CHECKPOINT = ROOT / "checkpoints" / "ernie-4.5-0.3b-paddle"
# a JSON object whose one string is longer than any --tokens can write: every request decodes
# exactly --tokens constrained tokens (the grammar never lets it end early)
LONG_OBJECT = {"type": "object", "properties": {"text": {"type": "string", "minLength": 4096}},
               "required": ["text"], "additionalProperties": False}


def checkpoint() -> Path:
    if not (CHECKPOINT / "model.safetensors").is_file():
        print(f"generating {CHECKPOINT} (once)", flush=True)
        generate_checkpoint(CHECKPOINT, "0.3b", naming="paddle")
    return CHECKPOINT


def run(llm, batch: int, tokens: int, constrained: bool) -> tuple[float, float, int]:
    from fd_core import SamplingParams

    guided = {"json": LONG_OBJECT} if constrained else None
    params = [SamplingParams(max_tokens=tokens, min_tokens=tokens, seed=i, guided_decoding=guided)
              for i in range(batch)]
    start, cpu = time.perf_counter(), time.process_time()
    outs = llm.generate(["Give me a JSON object:"] * batch, params, use_tqdm=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return wall, cpu, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", default="x86")
    p.add_argument("--quantization", default="wint8")
    args = p.parse_args()
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    print(f"# {cpu}; backend {args.backend}, {args.quantization}, {args.tokens} output tokens per request")
    from fd_core import LLM

    llm = LLM(model=str(checkpoint()), backend=args.backend, quantization=args.quantization,
              max_model_len=512, max_num_seqs=max(args.batch), guided_decoding_disable_any_whitespace=False)
    run(llm, 1, 4, True)  # warm-up: builds the grammar vocabulary once
    for batch in args.batch:
        free, guided, free_cpu, guided_cpu = [], [], [], []
        for _ in range(args.repeats):
            for constrained, into, into_cpu in ((False, free, free_cpu), (True, guided, guided_cpu)):
                wall, cpu, n = run(llm, batch, args.tokens, constrained)
                into.append(n / wall)
                into_cpu.append(cpu / n * 1e3)
        f, g = statistics.median(free), statistics.median(guided)
        fc, gc = statistics.median(free_cpu), statistics.median(guided_cpu)
        # CPU ms per token (all threads): less swayed than tok/s by other processes on a shared machine
        print(f"B={batch:3d}: unconstrained {f:8.1f} tok/s, constrained {g:8.1f} tok/s, "
              f"ratio {f / g:.3f}; CPU ms/token {fc:.2f} vs {gc:.2f}, ratio {gc / fc:.3f}", flush=True)
    from fd_core.sampling.guided import GuidedDecodingParams
    from tests.structured.schemas import SCHEMAS

    backend = llm.llm_engine.core.structured._backend("llguidance")  # the engine's own, on the 0.3B vocabulary
    times = []
    for schema in SCHEMAS.values():
        kind, text = GuidedDecodingParams(json=schema).spec()
        t0 = time.perf_counter()
        backend.compile(kind, text)
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"compile ms per schema over {len(times)} schemas (vocab {backend.vocab.vocab_size}): median "
          f"{statistics.median(times):.2f}, max {max(times):.2f}, "
          + json.dumps({k: round(t, 2) for k, t in zip(SCHEMAS, times)}))


if __name__ == "__main__":
    main()
