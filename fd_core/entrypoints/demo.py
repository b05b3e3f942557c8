"""``python -m fd_core.entrypoints.demo``: what a newcomer runs first.

Lists the backends, generates the ERNIE-4.5-0.3B-shaped demo checkpoint
(random weights: the text is gibberish, the engine is real) unless it
exists, and chats with it through ``LLM`` on the best usable backend.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

DEFAULT_DIR = Path("checkpoints") / "ernie-4.5-0.3b-demo"


def ensure_demo_checkpoint(path: Path = DEFAULT_DIR, shape: str = "0.3b") -> Path:
    """Generate the demo checkpoint once; reuse it afterwards."""
    from fd_core.testing.checkpoints import generate_checkpoint

    if not (path / "config.json").is_file():
        print(f"generating the {shape} demo checkpoint (random weights) in {path} ...", flush=True)
        generate_checkpoint(path, shape, naming="paddle", seed=0)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="0.3b", help="0.3b (default), tiny-dense or tiny-moe")
    parser.add_argument("--out", type=Path, default=None, help="checkpoint directory")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args(argv)

    from fd_core import LLM, SamplingParams
    from fd_core.backends import format_listing, list_backends

    print(format_listing(list_backends()), "\n", flush=True)
    model = ensure_demo_checkpoint(args.out or DEFAULT_DIR.with_name(f"ernie-4.5-{args.shape}-demo"), args.shape)
    llm = LLM(str(model), backend=args.backend, max_model_len=1024, max_num_seqs=8)
    conversations = [
        [{"role": "user", "content": "What is PaddlePaddle?"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers."}],
        [{"role": "user", "content": "写一首关于春天的诗"}],
        [{"role": "user", "content": "Explain paged attention in one sentence."}],
    ]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.7, top_p=0.9, seed=0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.chat(conversations, params)
    elapsed = time.perf_counter() - start
    for conversation, out in zip(conversations, outputs):
        print(f"\nuser: {conversation[-1]['content']}\nmodel ({len(out.outputs[0].token_ids)} tokens): "
              f"{out.outputs[0].text!r}")
    total = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"\n{total} tokens for {len(outputs)} chats in {elapsed:.1f} s ({total / elapsed:.1f} tokens/s) "
          f"on backend {llm.engine.core.backend.name}. Random weights: the text is not meant to read.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
