"""``fd-serve``: the OpenAI-compatible server, with FastDeploy's launch flags.

The same flags work for ``python -m fd_core.entrypoints.openai.api_server``.
Flags naming features that are not implemented fail at start-up with a
message saying so (exit 2); they are never silently ignored.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["build_parser", "serve_main", "engine_args_from", "server_kwargs_from"]


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _json_or_str(text: str) -> Any:
    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fd-serve",
        description="fd-core OpenAI-compatible server. Flags keep FastDeploy's names and meanings.",
    )
    a = p.add_argument
    a("--list-backends", action="store_true", help="list installed backends and whether each is usable here")
    a("--model", help="model directory or hub id; 'demo' generates and serves the ERNIE-4.5-0.3B-shaped "
                      "demo checkpoint (random weights)")
    a("--tokenizer", help="tokenizer directory (default: the model's)")
    a("--served-model-name", nargs="+", help="name(s) clients use in the 'model' field (default: --model)")
    a("--host", default="0.0.0.0")
    a("--port", type=int, default=8000)
    a("--metrics-port", type=int, default=None, help="serve /metrics on this port too")
    a("--backend", default="auto", help="auto, cpu, cuda, xpu, iluvatar, dcu, gcu or an installed plugin")
    a("--max-model-len", type=int, default=2048)
    a("--max-num-seqs", type=int, default=8)
    a("--max-num-batched-tokens", type=int, default=None)
    a("--block-size", type=int, default=64)
    a("--tensor-parallel-size", "--tp", type=int, default=1)
    a("--quantization", type=_json_or_str, default=None, help="wint8, wint4, ... or FastDeploy's JSON form")
    a("--gpu-memory-utilization", type=float, default=0.9)
    a("--kv-cache-ratio", type=float, default=0.75)
    a("--num-gpu-blocks-override", type=int, default=None)
    a("--enable-prefix-caching", type=_bool, nargs="?", const=True, default=True)
    a("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    a("--swap-space", type=float, default=0.0, help="GiB of host memory for evicted prefix-cache blocks")
    a("--enable-chunked-prefill", type=_bool, nargs="?", const=True, default=None)
    a("--use-cudagraph", type=_bool, nargs="?", const=True, default=False)
    a("--speculative-config", type=_json_or_str, default=None)
    a("--reasoning-parser", default=None, help="ernie_x1, ernie-45-vl, qwen3, ...")
    a("--tool-call-parser", default=None, help="ernie_x1, ...")
    a("--chat-template", default=None, help="a jinja2 template file or string")
    a("--limit-mm-per-prompt", type=_json_or_str, default=None)
    a("--load-choices", "--load_choices", dest="load_choices", default="default_v1",
      help="weight loader: default or default_v1 (both load safetensors tensor by tensor here)")
    a("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or set FD_API_KEY)")
    a("--max-concurrency", type=int, default=512, help="requests in flight above this get 429")
    a("--seed", type=int, default=0)
    a("--disable-log-requests", action="store_true")
    return p


def engine_args_from(ns: argparse.Namespace) -> Any:
    """EngineArgs from parsed flags; raises ValueError naming a bad or unsupported flag."""
    from fd_core.config import EngineArgs, UnsupportedFeatureError

    if ns.limit_mm_per_prompt:
        raise UnsupportedFeatureError("--limit-mm-per-prompt: multimodal models are not implemented yet")
    if ns.load_choices not in ("default", "default_v1"):
        raise ValueError(f"--load-choices must be 'default' or 'default_v1', got {ns.load_choices!r}")
    return EngineArgs.from_kwargs(
        ns.model,
        tokenizer=ns.tokenizer,
        served_model_name=(ns.served_model_name or [None])[0],
        backend=ns.backend,
        max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        block_size=ns.block_size,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        kv_cache_ratio=ns.kv_cache_ratio,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        enable_prefix_caching=ns.enable_prefix_caching,
        swap_space=ns.swap_space,
        enable_chunked_prefill=ns.enable_chunked_prefill,
        tensor_parallel_size=ns.tensor_parallel_size,
        quantization=ns.quantization,
        use_cudagraph=ns.use_cudagraph,
        speculative_config=ns.speculative_config,
        chat_template=ns.chat_template,
        seed=ns.seed,
    )


def server_kwargs_from(ns: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for the HTTP layer's ServerArgs."""
    from fd_core import envs

    names = ns.served_model_name or [ns.model]
    return dict(
        served_model_names=tuple(names),
        api_key=ns.api_key or envs.get("FD_API_KEY"),
        max_concurrency=ns.max_concurrency,
        reasoning_parser=ns.reasoning_parser,
        tool_call_parser=ns.tool_call_parser,
        max_model_len=ns.max_model_len,
        metrics_port=ns.metrics_port,
    )


def serve_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.list_backends:
        from fd_core.backends.registry import format_listing, list_backends

        print(format_listing(list_backends()))
        return 0
    if not ns.model:
        parser.error("--model is required (or --list-backends); --model demo serves a generated demo model")
    from fd_core.entrypoints.serve import run_server

    return run_server(ns)


if __name__ == "__main__":
    sys.exit(serve_main())
