"""FastDeploy's environment variables that fd-core does not read, and why.

Two tables, read by ``fd_core.envs.log_no_effect`` at start-up:

- ``NO_EFFECT``: name -> the reason it changes nothing here (the thing it
  tunes does not exist in fd-core, or fd-core always behaves one way);
- ``NOT_IMPLEMENTED``: name -> the feature it belongs to, which a later
  issue builds (a WARNING, never an exit: such variables are often set
  machine-wide).

Variables read with an effect are in ``fd_core.envs.VARIABLES``. Sources:
FastDeploy's docs/usage/environment_variables.md and fastdeploy/envs.py.
"""

from __future__ import annotations

__all__ = ["NO_EFFECT", "NOT_IMPLEMENTED", "OWNED_PREFIXES"]

# FD_* names owned by a backend distribution (read there, documented there)
OWNED_PREFIXES = ("FD_X86_",)

_NO_QUEUES = ("fd-core has no internal TCP ports or worker queues: the API process and the engine "
              "talk over one ZeroMQ IPC socket pair")
_KERNELS = ("kernels are chosen by the --backend plugin (cpu, x86, cuda, ...), not by this switch")
_NO_CACHE_PROCESS = ("there is no cache-transfer process: the host tier (--swap-space) lives in the "
                     "engine process")
_TRACING = "tracing export (OpenTelemetry)"
_PD = "prefill/decode disaggregation"
_ADAPTER = "the internal ZMQ adapter to the engine (cluster / router)"
_WEIGHTS = "dynamic weight update (RL training loops)"

NO_EFFECT: dict[str, str] = {
    # transport between processes
    "INFERENCE_MSG_QUEUE_ID": _NO_QUEUES,
    "FD_ENGINE_TASK_QUEUE_WITH_SHM": _NO_QUEUES,
    "FD_ZMQ_SNDHWM": _NO_QUEUES,
    "FD_USE_GET_SAVE_OUTPUT_V1": _NO_QUEUES,
    "FD_USE_AGGREGATE_SEND": _NO_QUEUES,
    "ZMQ_SEND_BATCH_DATA": _NO_QUEUES,
    "FD_DEALER_CONNECTIONS": _NO_QUEUES,
    "FMQ_CONFIG_JSON": _NO_QUEUES,
    "FD_TOKEN_PROCESSOR_HEALTH_TIMEOUT": "the engine runs in one process; its death is noticed at once",
    "FD_WORKER_ALIVE_TIMEOUT": "the engine runs in one process; its death is noticed at once",
    "FD_ENABLE_ASYNC_LLM": "the server's engine client is always asynchronous",
    # scheduler
    "ENABLE_V1_KVCACHE_SCHEDULER": "fd-core always uses its token-budget (v1-style) KV-cache scheduler",
    "FD_ENC_DEC_BLOCK_NUM": "KV blocks are allocated on demand every step; none are preallocated for decode",
    "FD_DISABLED_RECOVER": "a request that runs out of KV blocks is always preempted and recomputed later",
    "FD_RESERVE_OUTPUT_BLOCK_NUM_FOR_DECODE_WHEN_SCHEDULE_NEW_PREFILL":
        "the scheduler preempts when blocks run out instead of reserving decode blocks",
    "FD_RESERVE_DECAY_OUTPUT_BLOCK_NUM_FOR_DECODE_WHEN_SCHEDULE_NEW_PREFILL":
        "the scheduler preempts when blocks run out instead of reserving decode blocks",
    "FD_RESERVE_MIN_OUTPUT_BLOCK_NUM_FOR_DECODE_WHEN_SCHEDULE_NEW_PREFILL":
        "the scheduler preempts when blocks run out instead of reserving decode blocks",
    "FD_ENABLE_REQUEST_DISCONNECT_STOP_INFERENCE": "a request whose client disconnects is always aborted",
    # stop sequences: FastDeploy sizes GPU buffers with these
    "FD_MAX_STOP_SEQS_NUM": "stop strings are matched on the detokenized text, with no buffer limiting their number",
    "FD_STOP_SEQS_MAX_LEN": "stop strings are matched on the detokenized text, with no buffer limiting their length",
    "FD_STOP_TOKEN_IDS_MAX_LEN": "stop token ids are checked in Python, with no buffer limiting their number",
    # kernels and hardware switches
    "FD_USE_DEEP_GEMM": _KERNELS,
    "FD_USE_MACHETE": _KERNELS,
    "FD_MOE_BACKEND": _KERNELS,
    "FD_USE_BLACKWELL_GEMM": _KERNELS,
    "FD_USE_PFCC_DEEP_EP": _KERNELS,
    "FD_ENABLE_PDL": _KERNELS,
    "FD_NVFP4_LOAD_BLOCKSCALE_LEAVE": _KERNELS,
    "FD_MOE_MXFP4_BACKEND": _KERNELS,
    "FD_NVFP4_GEMM_BACKEND": _KERNELS,
    "FD_CUSTOM_AR_MAX_SIZE_MB": _KERNELS,
    "FD_USE_PHI_FP8_QUANT": _KERNELS,
    "FD_USE_PHI_MOE_TOPK": _KERNELS,
    "FD_USE_PHI_MOE_PERMUTE": _KERNELS,
    "FD_USE_PHI_RMSNORM": _KERNELS,
    "FD_SiluAndMul_USE_PHI_SWIGLU": _KERNELS,
    "FD_FP8_QUANT_WITH_POW2SCALE": _KERNELS,
    "FD_MOE_PROB_IN_ADVANCE": _KERNELS,
    "FD_CPU_USE_BF16": _KERNELS,
    "FD_HPU_CHUNK_SIZE": _KERNELS,
    "FD_HPU_MEASUREMENT_MODE": _KERNELS,
    "FD_GCU_ATTN_MONITOR": _KERNELS,
    "FD_MOE_QUANT_MULTI_PROCESS_GROUP_SIZE": _KERNELS,
    "FD_XPU_MOE_FFN_QUANT_TYPE_MAP": _KERNELS,
    "FD_XPU_ENABLE_MIXED_EP_MODE": _KERNELS,
    "FD_ILUVATAR_KVCACHE_MEM": "the KV cache is sized from --gpu-memory-utilization or --num-gpu-blocks-override",
    "FD_METAX_KVCACHE_MEM": "the KV cache is sized from --gpu-memory-utilization or --num-gpu-blocks-override",
    "FD_TRITON_KERNEL_CACHE_DIR": "fd-core compiles no Triton kernels",
    "FD_BUILDING_ARCS": "a build-time switch of FastDeploy's CUDA operators; backends are built by their own packages",
    # weights, tokenizer, caches
    "FD_CACHE_PARAMS": "KV-cache quantization scales are not read from a separate directory",
    "FD_USE_HF_TOKENIZER": "the tokenizer is read from the checkpoint's own files either way",
    "FD_USE_FASTSAFETENSOR": "safetensors are memory-mapped by fd-core's own reader",
    "FD_FOR_TORCH_MODEL_FORMAT": "PyTorch-named checkpoints are recognised by their tensor names",
    "FD_ENABLE_MODEL_LOAD_CACHE": "weights are quantized at every load; no quantized copy is cached on disk",
    "FD_ENABLE_MODEL_CACHE": "weights are quantized at every load; no quantized copy is cached on disk",
    "FD_DEBUG_SERIALIZE_MODEL_PATH": "weights are never serialized for debugging",
    "FD_CACHE_PROC_EXIT_TIMEOUT": _NO_CACHE_PROCESS,
    "FD_CACHE_PROC_ERROR_COUNT": _NO_CACHE_PROCESS,
    # server and logging
    "FD_SUPPORT_MAX_CONNECTIONS": "the HTTP server takes any number of connections; --max-concurrency limits requests",
    "FD_ENABLE_MULTI_API_SERVER": "several API processes are started with --workers",
    "FD_LOG_REQUESTS": "one INFO line is logged per request; --disable-log-requests turns it off",
    "FD_LOG_REQUESTS_LEVEL": "one INFO line is logged per request; --disable-log-requests turns it off",
    "FD_LOG_MAX_LEN": "request logs carry counts and timings, never request bodies",
    "FD_CONSOLE_SCHEDULER_METRICS": "per-step scheduler lines are logged at DEBUG (FD_DEBUG=1)",
    "FD_CONSOLE_DECODE_LOG_INTERVAL": "per-step scheduler lines are logged at DEBUG (FD_DEBUG=1)",
    "FD_ENABLE_OBJGRAPH_DEBUG": "no objgraph debugging is built in",
    "FD_USAGE_STATS_SERVER": "fd-core collects no usage statistics",
    "FD_USAGE_SOURCE": "fd-core collects no usage statistics",
    "FD_CONFIG_ROOT": "fd-core collects no usage statistics",
    "FD_VENV": "read by the scripts/ helpers only (the virtual environment to use)",
}

NOT_IMPLEMENTED: dict[str, str] = {
    "FD_TP_GROUP_GID_OFFSET": "tensor parallelism",
    "FD_EP_BATCHED_TOKEN_TIMEOUT": "expert parallelism",
    "FD_EP_MAX_PREFETCH_TASK_NUM": _PD,
    "FD_PD_CHANGEABLE": _PD,
    "FD_ENABLE_CACHE_TASK": _PD,
    "FD_OFFLINE_PERF_TEST_FOR_PD": _PD,
    "FD_PREFILL_WAIT_DECODE_RESOURCE_SECONDS": _PD,
    "PREFILL_CONTINUOUS_REQUEST_DECODE_RESOURCES": _PD,
    "FD_ENABLE_PD_RDMA_EAGER_CONNECT": _PD,
    "FD_PD_REORDER": _PD,
    "FD_SAVE_OUTPUT_CACHE_FOR_PREEMPTED_REQUEST": "a KV-cache storage tier",
    "FD_ENABLE_INTERNAL_ADAPTER": _ADAPTER,
    "FD_ZMQ_RECV_REQUEST_SERVER_PORT": _ADAPTER,
    "FD_ZMQ_SEND_RESPONSE_SERVER_PORT": _ADAPTER,
    "FD_ZMQ_RECV_REQUEST_SERVER_PORTS": _ADAPTER,
    "FD_ZMQ_SEND_RESPONSE_SERVER_PORTS": _ADAPTER,
    "FD_ZMQ_CONTROL_CMD_SERVER_PORTS": _ADAPTER,
    "FD_ENABLE_RETURN_TEXT": _ADAPTER,
    "FD_ENABLE_MAX_PREFILL": "the max-prefill scheduling policy",
    "FD_ENABLE_E2W_TENSOR_CONVERT": "multimodal input",
    "ENCODE_FEATURE_BOS_AK": "multimodal input (features stored in BOS)",
    "ENCODE_FEATURE_BOS_SK": "multimodal input (features stored in BOS)",
    "ENCODE_FEATURE_ENDPOINT": "multimodal input (features stored in BOS)",
    "FD_FILL_BITMASK_BATCH": "structured output",
    "FD_GUIDANCE_DISABLE_ADDITIONAL": "structured output",
    "FD_LLGUIDANCE_LOG_LEVEL": "structured output",
    "SPECULATE_VERIFY_USE_TOPK": "speculative decoding",
    "SPECULATE_VERIFY_USE_TARGET_SAMPLING": "speculative decoding",
    "FD_ENABLE_SWAP_SPACE_CLEARING": _WEIGHTS,
    "FD_ENABLE_V1_UPDATE_WEIGHTS": _WEIGHTS,
    "FD_ENABLE_RL": _WEIGHTS,
    "FD_DETERMINISTIC_MODE": "batch-invariant deterministic inference",
    "FD_DETERMINISTIC_SPLIT_KV_SIZE": "batch-invariant deterministic inference",
    "FD_DETERMINISTIC_LOG_MODE": "batch-invariant deterministic inference",
    "TRACES_ENABLE": _TRACING,
    "TRACES_EXPORTER": _TRACING,
    "EXPORTER_OTLP_ENDPOINT": _TRACING,
    "EXPORTER_OTLP_HEADERS": _TRACING,
    "FD_TRACE": _TRACING,
    "FD_SERVICE_NAME": _TRACING,
    "FD_HOST_NAME": _TRACING,
    "FD_JOB_ID": _TRACING,
    "FD_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS": _TRACING,
    "FD_OTLP_EXPORTER_MAX_EXPORT_BATCH_SIZE": _TRACING,
}
