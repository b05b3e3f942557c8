"""``fd-serve``: the OpenAI-compatible server, with FastDeploy's launch flags.

The same flags work for ``python -m fd_core.entrypoints.openai.api_server``.
Every FastDeploy flag is known (fd_core/flags.py classifies them): flags
naming features that are not implemented fail at start-up with a message
saying so (exit 2); flags with no effect here are logged at INFO; none is
silently ignored.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from fd_core.flags import FLAGS, check_flag, parse_bool, parse_json_or_str

__all__ = ["build_parser", "serve_main", "engine_args_from", "fastdeploy_flag_notes", "server_kwargs_from"]

logger = logging.getLogger("fd_core.serve")


def _bool(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _json_or_str(text: str) -> Any:
    try:
        return parse_json_or_str(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add(p: argparse.ArgumentParser, name: str, *more: str, **kwargs: Any) -> None:
    """A flag under its name, its all-dash and all-underscore spellings (FastDeploy's
    docs use both) and ``more`` aliases."""
    body = name.lstrip("-")
    spellings = dict.fromkeys([name, "--" + body.replace("_", "-"), "--" + body.replace("-", "_"), *more])
    kwargs.setdefault("dest", body.replace("-", "_"))
    p.add_argument(*spellings, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fd-serve", allow_abbrev=False,
        description="fd-core OpenAI-compatible server. Flags keep FastDeploy's names and meanings; "
                    "every FastDeploy flag is known (see the README's 'Coming from FastDeploy').",
    )

    def a(name: str, *more: str, **kwargs: Any) -> None:
        _add(p, name, *more, **kwargs)

    a("--list-backends", action="store_true", help="list installed backends and whether each is usable here")
    a("--model", help="model directory or hub id; 'demo' generates and serves the ERNIE-4.5-0.3B-shaped "
                      "demo checkpoint (random weights)")
    a("--revision", default=None, help="hub revision (branch, tag or commit) of --model")
    a("--tokenizer", help="tokenizer directory (default: the model's)")
    a("--served-model-name", nargs="+", help="name(s) clients use in the 'model' field (default: --model)")
    a("--host", default="0.0.0.0")
    a("--port", type=int, default=8000)
    a("--metrics-port", type=int, default=None, help="serve /metrics (and /config-info) on this port too")
    a("--workers", type=int, default=1, help="API server processes sharing one engine")
    a("--backend", default="auto", help="auto, cpu, x86, cuda, xpu, iluvatar, dcu, gcu or an installed plugin")
    a("--max-model-len", type=int, default=2048)
    a("--max-num-seqs", type=int, default=8)
    a("--max-num-batched-tokens", type=int, default=None)
    a("--block-size", type=int, default=64)
    a("--tensor-parallel-size", "-tp", "--tp", type=int, default=1)
    a("--enable-expert-parallel", action="store_true",
      help="MoE models: partition the routed experts over the --tensor-parallel-size ranks")
    a("--ips", default=None,
      help="multi-node TP: the hosts, comma-separated, the first the master (FD_MASTER_PORT, FD_NODE_RANK)")
    a("--splitwise-role", default="mixed", choices=["mixed", "prefill", "decode"],
      help="prefill/decode disaggregation: prefill serves decode instances' prompts, decode takes the "
           "clients' requests and has their prompts prefilled by --innode-prefill-ports (FD_PD_TRANSFER_TIMEOUT)")
    a("--innode-prefill-ports", default=None,
      help="decode: the prefill instances' --engine-worker-queue-port, comma-separated (host:port elsewhere)")
    a("--engine-worker-queue-port", default=None,
      help="prefill: the port on 127.0.0.1 its KV-transfer tasks arrive on (no effect otherwise)")
    a("--pd-comm-port", default=None, help="prefill: also serve KV-transfer tasks on every interface at this port")
    a("--cache-transfer-protocol", default=None,
      help="KV transfer protocol: tcp (built in, the default) or one a backend brings (ipc, rdma)")
    a("--data-parallel-size", type=int, default=1,
      help="engine replicas behind this server; each request goes to the least-loaded one")
    a("--quantization", type=_json_or_str, default=None, help="wint8, wint4, ... or FastDeploy's JSON form")
    a("--dtype", default="auto", help="weights' dtype: auto (the checkpoint's), bfloat16, float16, float32")
    a("--kv-cache-dtype", default="auto",
      help="KV cache dtype: auto (the model's), bfloat16, float16, float32, int8, fp8")
    a("--lm_head-fp32", action="store_true", help="keep the LM head in fp32 whatever --quantization says")
    a("--gpu-memory-utilization", type=float, default=0.9)
    a("--num-gpu-blocks-override", type=int, default=None)
    a("--enable-prefix-caching", type=_bool, nargs="?", const=True, default=True)
    a("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    a("--swap-space", type=float, default=0.0, help="GiB of host memory for evicted prefix-cache blocks "
                                                    "(clamped to what the host can spare)")
    a("--enable-chunked-prefill", type=_bool, nargs="?", const=True, default=None)
    a("--max-num-partial-prefills", type=int, default=1)
    a("--max-long-partial-prefills", type=int, default=1)
    a("--long-prefill-token-threshold", type=int, default=0)
    a("--num-scheduler-steps", type=int, default=1,
      help="multi-step decoding: up to this many decode steps per schedule (vLLM's flag; requests with "
           "logprobs, penalties, bias, bad words, min_tokens, stop strings, grammars or a thinking budget take "
           "one)")
    a("--use-cudagraph", type=_bool, nargs="?", const=True, default=False)
    a("--speculative-config", type=_json_or_str, default=None)
    a("--reasoning-parser", default=None, help="ernie_x1, ernie-45-vl, qwen3, ...")
    a("--tool-call-parser", default=None, help="ernie_x1, ...")
    a("--tool-parser-plugin", default=None, help="a Python file registering tool parsers "
                                                  "(@ToolParserManager.register_module)")
    a("--chat-template", default=None, help="a jinja2 template file or string")
    a("--disallow-request-chat-template", action="store_true",
      help="answer 400 to requests carrying their own chat_template")
    a("--escape-special-tokens", action="store_true",
      help="special-token strings in user and tool message content are tokenized as plain text, so a user "
           "cannot forge control tokens or turns (default off: they become control tokens, as in FastDeploy)")
    a("--api-key", action="append", default=None,
      help="require 'Authorization: Bearer KEY'; repeat for several keys (or FD_API_KEY=k1,k2)")
    a("--max-concurrency", type=int, default=512,
      help="engine requests (sequences: n, prompts x n) in flight; more get 429")
    a("--max-request-body-bytes", type=int, default=None,
      help="larger request bodies get 413 (default: 16 MiB + 64 bytes per --max-model-len token)")
    a("--max-waiting-time", type=float, default=-1,
      help="seconds a request may wait to be served (queued and prefilled) before it gets 408; -1: no limit")
    a("--timeout-graceful-shutdown", type=float, default=0,
      help="on SIGTERM, seconds to let requests in flight finish before they are aborted; 0: no limit")
    a("--seed", type=int, default=None, help="default seed of requests that give none (reproducible server)")
    a("--max-logprobs", type=int, default=20, help="top logprobs a request may ask for (at most 20)")
    a("--enable-early-stop", action="store_true", help="FastDeploy's repetition early stop")
    a("--early-stop-config", type=_json_or_str, default=None,
      help='e.g. \'{"window_size": 3000, "threshold": 0.99}\'')
    a("--logits-processors", nargs="+", default=None, help="logits processor classes (module:Class)")
    a("--guided-decoding-backend", default="auto", choices=["auto", "llguidance", "xgrammar", "off"],
      help="structured output's grammar engine (auto: llguidance; xgrammar needs torch; off: refuse "
           "response_format / guided_* requests)")
    a("--guided-decoding-disable-any-whitespace", type=_bool, nargs="?", const=True, default=False,
      help="JSON constraints allow no whitespace between tokens (compact JSON)")
    a("--enable-mm", action="store_true",
      help="multimodal input (image content parts); on by itself for a multimodal model such as ERNIE-4.5-VL, "
           "an error for a text model")
    a("--limit-mm-per-prompt", type=_json_or_str, default=None,
      help='images / videos one prompt may hold, e.g. \'{"image": 10, "video": 3}\' (default 100 each); '
           "more is a 400")
    a("--mm-processor-kwargs", type=_json_or_str, default=None,
      help='image processor settings, e.g. \'{"image_max_pixels": 12845056}\' (image_min_pixels, '
           "image_max_pixels; video_fps, video_min_frames, video_max_frames kept for video input)")
    a("--allowed-local-media-path", default=None,
      help="image_url parts may name local files (file:// URLs or paths) under this directory (default: none)")
    a("--allowed-media-domains", nargs="+", default=None,
      help="image_url parts may be http(s) URLs of these hosts, fetched by the server (default: none)")
    a("--disable-log-requests", action="store_true", help="no INFO line per request")
    a("--disable-fastapi-docs", action="store_true",
      help="serve no /docs, /redoc, /openapi.json (with --api-key they need the key)")
    _add_scheduler_flags(a)
    a("--router", default=None, help="fd-router to register this instance with (host:port or http://host:port); "
      "it registers once listening and again every few seconds")
    for flag in FLAGS:
        if flag.kind in ("engine", "server"):
            continue
        kwargs: dict[str, Any] = dict(default=argparse.SUPPRESS, dest=flag.dest,
                                      help=f"(FastDeploy) {flag.kind.replace('_', ' ')}: {flag.reason}")
        if flag.type is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(type=_argparse_type(flag.type), nargs=flag.nargs, **flag.extra)
            if flag.nargs == "?" and "const" not in kwargs:
                kwargs["const"] = True
        p.add_argument(*flag.spellings, **kwargs)
    # FastDeploy's BooleanOptionalAction flags also have a --no- form
    for name in ("enable-output-caching", "shutdown-comm-group-if-worker-idle"):
        a(f"--no-{name}", dest=name.replace("-", "_"), action="store_false", default=argparse.SUPPRESS,
          help=f"(FastDeploy) see --{name}")
    return p


def _add_scheduler_flags(a: Any) -> None:
    """FastDeploy's scheduler flags (fd_core.cluster; defaults there, FastDeploy's)."""
    a("--scheduler-name", default=None, choices=["local", "global", "splitwise"],
      help="local (default): this instance alone; global: instances of one --scheduler-topic share work "
           "through Redis (idle ones steal queued requests); splitwise: issue 18 item 2, not yet")
    a("--scheduler-host", default=None, help="global: the Redis server's host (default 127.0.0.1)")
    a("--scheduler-port", type=int, default=None, help="global: the Redis server's port (default 6379)")
    a("--scheduler-db", type=int, default=None, help="global: the Redis database index (default 0)")
    a("--scheduler-password", default=None, help="global: the Redis password (default none)")
    a("--scheduler-topic", default=None, help="global: only instances of one topic share work (default 'default')")
    a("--scheduler-ttl", type=int, default=None, help="global: seconds a request may live in Redis (default 900)")
    a("--scheduler-min-load-score", type=float, default=None,
      help="global: an idle instance steals only from a queue holding at least this many requests (default 3)")
    a("--scheduler-load-shards-num", type=int, default=None,
      help="global: shards of the instance load table in Redis (default 1)")
    a("--scheduler-expire-period", type=int, default=None,
      help="global: milliseconds without a heartbeat after which an instance is gone (default 3000; "
           "milliseconds as FastDeploy's scheduler reads it, although its docs' table says seconds)")


def _argparse_type(parse: Any) -> Any:
    if parse in (str, int, float):
        return parse

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def fastdeploy_flag_notes(ns: argparse.Namespace) -> list[str]:
    """Check the FastDeploy flags fd-core does not implement: raise FlagError (exit 2)
    for one it cannot honour, return the INFO lines for those with no effect here."""
    notes = []
    for flag in FLAGS:
        if flag.kind not in ("engine", "server") and hasattr(ns, flag.dest):
            note = check_flag(flag, getattr(ns, flag.dest))
            if note:
                notes.append(note)
    return notes


def engine_args_from(ns: argparse.Namespace) -> Any:
    """EngineArgs from parsed flags; raises ValueError naming a bad or unsupported flag."""
    from fd_core.config import EngineArgs

    for note in fastdeploy_flag_notes(ns):
        logger.info("%s", note)
    if ns.max_waiting_time is not None and ns.max_waiting_time != -1 and ns.max_waiting_time <= 0:
        raise ValueError(f"--max-waiting-time must be > 0 seconds or -1 (no limit), got {ns.max_waiting_time}")
    if ns.timeout_graceful_shutdown < 0:
        raise ValueError(f"--timeout-graceful-shutdown must be >= 0 seconds (0: no limit), "
                         f"got {ns.timeout_graceful_shutdown}")
    if ns.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {ns.workers}")
    if ns.tool_parser_plugin:
        from fd_core.parsers import ToolParserManager

        ToolParserManager.import_tool_parser(ns.tool_parser_plugin)
    args = EngineArgs.from_kwargs(
        ns.model,
        tokenizer=ns.tokenizer,
        served_model_name=(ns.served_model_name or [None])[0],
        revision=ns.revision,
        backend=ns.backend,
        max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        block_size=ns.block_size,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        enable_prefix_caching=ns.enable_prefix_caching,
        swap_space=ns.swap_space,
        enable_chunked_prefill=ns.enable_chunked_prefill,
        max_num_partial_prefills=ns.max_num_partial_prefills,
        max_long_partial_prefills=ns.max_long_partial_prefills,
        long_prefill_token_threshold=ns.long_prefill_token_threshold,
        num_scheduler_steps=ns.num_scheduler_steps,
        tensor_parallel_size=ns.tensor_parallel_size,
        enable_expert_parallel=ns.enable_expert_parallel,
        data_parallel_size=ns.data_parallel_size,
        ips=ns.ips,
        splitwise_role=ns.splitwise_role,
        innode_prefill_ports=ns.innode_prefill_ports,
        engine_worker_queue_port=ns.engine_worker_queue_port,
        pd_comm_port=ns.pd_comm_port,
        cache_transfer_protocol=ns.cache_transfer_protocol,
        core_wrapper=_core_wrapper(ns.splitwise_role),
        quantization=ns.quantization,
        lm_head_fp32=ns.lm_head_fp32,
        use_cudagraph=ns.use_cudagraph,
        speculative_config=ns.speculative_config,
        chat_template=ns.chat_template,
        seed=ns.seed,
        max_logprobs=ns.max_logprobs,
        enable_early_stop=ns.enable_early_stop,
        early_stop_config=ns.early_stop_config,
        logits_processors=ns.logits_processors,
        dtype=ns.dtype,
        kv_cache_dtype=ns.kv_cache_dtype,
        guided_decoding_backend=ns.guided_decoding_backend,
        guided_decoding_disable_any_whitespace=ns.guided_decoding_disable_any_whitespace,
    )
    if args.core_wrapper is not None:  # --splitwise-role: its flags checked before any model loads
        from fd_core.disagg import disagg_config_from

        disagg_config_from(args)
    return args


def _core_wrapper(role: str | None) -> Any:
    """fd_core.disagg's engine wrapper for --splitwise-role prefill/decode, else None."""
    if role in (None, "mixed"):
        return None
    from fd_core.disagg.engine import disaggregate

    return disaggregate


def server_kwargs_from(ns: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for the HTTP layer's ServerArgs."""
    from fd_core import envs
    from fd_core.multimodal.options import MultiModalOptions

    names = ns.served_model_name or [ns.model]
    keys = tuple(ns.api_key or ()) or tuple(k.strip() for k in (envs.get("FD_API_KEY") or "").split(",")
                                            if k.strip())
    return dict(
        served_model_names=tuple(names),
        api_keys=keys,
        max_concurrency=ns.max_concurrency,
        max_waiting_time=None if ns.max_waiting_time in (None, -1) else ns.max_waiting_time,
        reasoning_parser=ns.reasoning_parser,
        tool_call_parser=ns.tool_call_parser,
        tool_parser_plugin=ns.tool_parser_plugin,
        max_model_len=ns.max_model_len,
        metrics_port=ns.metrics_port,
        allow_request_chat_template=not ns.disallow_request_chat_template,
        max_logprobs=ns.max_logprobs,
        max_request_body_bytes=ns.max_request_body_bytes,
        log_requests=not ns.disable_log_requests,
        fastapi_docs=not ns.disable_fastapi_docs,
        escape_special_tokens=ns.escape_special_tokens,
        enable_mm=ns.enable_mm,
        mm_options=MultiModalOptions.from_flags(ns.limit_mm_per_prompt, ns.mm_processor_kwargs,
                                                ns.allowed_local_media_path, ns.allowed_media_domains),
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
