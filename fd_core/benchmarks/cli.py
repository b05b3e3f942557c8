"""``fd-bench``: ``serve``, ``compare``, ``throughput`` and ``latency`` subcommands.

    fd-bench serve --base-url http://127.0.0.1:8000 --num-prompts 200 \\
        --random-input-len 512 --random-output-len 128 --request-rate 4 --save-result
    fd-bench compare --base-url http://127.0.0.1:8180 --label fd-core \\
        --base-url http://127.0.0.1:8081 --label llama.cpp --num-prompts 32 \\
        --random-input-range 128:512 --random-output-range 64:128 --request-rate 2
    fd-bench throughput --model DIR --backend cpu --input-len 128 --output-len 128
    fd-bench latency --model DIR --batch-size 8 --input-len 32 --output-len 128

Also ``python -m fd_core.benchmarks.cli ...``. Bad flags exit with status 2 and
a message naming them; ``--save-result`` writes the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main", "save_result"]


def build_parser() -> argparse.ArgumentParser:
    from fd_core.benchmarks.compare_servers import add_compare_args, run_compare
    from fd_core.benchmarks.offline import (
        add_latency_args,
        add_throughput_args,
        run_latency,
        run_throughput,
    )
    from fd_core.benchmarks.serve import add_serve_args, run_serve

    parser = argparse.ArgumentParser(prog="fd-bench", description="fd-core benchmarks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,compare,throughput,latency}")
    commands = (
        ("serve", "load an OpenAI-compatible server over streaming HTTP", add_serve_args, run_serve),
        ("compare", "the same token-id requests through several OpenAI-compatible servers, "
                    "one after the other, and their ratios", add_compare_args, run_compare),
        ("throughput", "offline throughput of the engine in process", add_throughput_args, run_throughput),
        ("latency", "offline prefill and per-step decode latency", add_latency_args, run_latency),
    )
    for name, text, add_args, run in commands:
        p = sub.add_parser(name, help=text, description=text)
        add_args(p)
        p.add_argument("--save-result", action="store_true", help="write the result as JSON")
        p.add_argument("--result-dir", default=".", help="folder for --save-result")
        p.add_argument("--result-filename", default=None,
                       help="file name for --save-result (default: fd-bench-COMMAND-...-DATE.json)")
        p.set_defaults(func=run)
    return parser


def _jsonable(value: Any) -> Any:
    """JSON has no inf/nan: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _default_filename(result: dict[str, Any]) -> str:
    cfg = result.get("config", {})
    parts = ["fd-bench", result.get("kind", "result")]
    if result.get("kind") == "compare":
        parts += [f"{cfg.get('request_rate')}qps", *(str(s["label"]) for s in result.get("servers", []))]
    elif result.get("kind") == "serve":
        parts += [f"{cfg.get('request_rate')}qps", f"concurrency{cfg.get('max_concurrency')}",
                  Path(str(result.get("model_id", "model"))).name]
    else:
        parts.append(Path(str(cfg.get("model", "model"))).name)
    return "-".join(parts + [result["date"]]) + ".json"


def save_result(result: dict[str, Any], result_dir: str = ".", filename: str | None = None) -> Path:
    """Write ``result`` as JSON under ``result_dir``; returns the path."""
    path = Path(result_dir) / (filename or _default_filename(result))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(result), indent=2) + "\n", encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError, ConnectionError) as exc:
        print(f"fd-bench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    if args.save_result:
        path = save_result(result, args.result_dir, args.result_filename)
        print(f"result written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
