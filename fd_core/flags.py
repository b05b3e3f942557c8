"""Every FastDeploy launch flag, and what fd-core does with it.

FastDeploy users keep their launch lines, so ``fd-serve``, ``python -m
fd_core.entrypoints.openai.api_server`` and ``LLM(**kwargs)`` know every flag
FastDeploy 2.x registers (its ``EngineArgs.add_cli_args`` and the api_server's
own flags, plus a few spellings from older 2.x releases). Each flag is one of:

- ``engine`` / ``server``: implemented (an ``EngineArgs`` field, or a flag of
  the HTTP layer);
- ``no_effect``: accepted; start-up logs one INFO line saying why it does
  nothing here (only where that is the truth);
- ``not_yet``: a feature a later issue builds; any value but the neutral one
  (the value that means "off") stops start-up (exit 2) naming the flag;
- ``unsupported``: a FastDeploy feature fd-core does not offer; refused the
  same way, with the reason.

Pure data and small helpers: no paddle, no argparse state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fd_core.errors import UnsupportedFeatureError

__all__ = ["FLAGS", "Flag", "FlagError", "by_dest", "check_flag", "parse_json_or_str", "parse_bool"]


class FlagError(UnsupportedFeatureError):
    """A flag names a feature fd-core does not have (yet)."""


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def parse_json_or_str(text: str) -> Any:
    """FastDeploy's JSON-valued flags: a JSON object, or a plain string."""
    text = text.strip()
    if text.startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
    return text


def parse_csv(text: str) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] or None


@dataclass(frozen=True)
class Flag:
    name: str  # as FastDeploy registers it, e.g. "--engine-worker-queue-port"
    kind: str  # engine | server | no_effect | not_yet | unsupported
    reason: str = ""  # no_effect / not_yet / unsupported: why, for the log line or the error
    neutral: tuple[Any, ...] = (None,)  # not_yet / unsupported: values accepted as "off"
    values: tuple[Any, ...] | None = None  # no_effect: the values FastDeploy accepts (None: any)
    type: Any = str  # argparse type (bool flags: store_true)
    nargs: str | None = None
    aliases: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # more argparse keywords (help, default, ...)

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    @property
    def spellings(self) -> list[str]:
        """The registered name, its all-dash and all-underscore forms, and aliases."""
        body = self.name.lstrip("-")
        forms = [self.name, "--" + body.replace("_", "-"), "--" + body.replace("-", "_"), *self.aliases]
        return list(dict.fromkeys(forms))


def _nf(name: str, reason: str, type: Any = str, **kw: Any) -> Flag:
    return Flag(name, "no_effect", reason, type=type, **kw)


def _ny(name: str, feature: str, issue: int, neutral: tuple[Any, ...] = (None, False), type: Any = str,
        **kw: Any) -> Flag:
    return Flag(name, "not_yet", f"{feature} is not implemented yet (issue {issue})", neutral, type=type, **kw)


def _un(name: str, reason: str, neutral: tuple[Any, ...] = (None, False), type: Any = str, **kw: Any) -> Flag:
    return Flag(name, "unsupported", reason, neutral, type=type, **kw)


BOOL = bool  # marks a store_true flag
PORTS = "internal ports: fd-core's API and engine processes talk over ZeroMQ IPC sockets, not TCP queues"
V0_SCHEDULER = ("a knob of FastDeploy's v0 block scheduler; fd-core's token-budget scheduler allocates "
                "blocks as a sequence grows")
SPLITWISE_ONLY = "only used with --splitwise-role prefill/decode (disaggregation, issue 18)"
SPLITWISE_SCHEDULER = ("only used by --scheduler-name splitwise (prefill/decode disaggregation, issue 18 "
                       "item 2); --scheduler-name global does not need it")
PAR = "parallelism beyond one device"

# Flags fd-core implements are declared with their argparse details in
# fd_core.entrypoints.cli; they are listed here so the table is complete.
_IMPLEMENTED_ENGINE = [
    "--model", "--served-model-name", "--revision", "--tokenizer", "--max-model-len", "--block-size",
    "--chat-template", "--quantization", "--seed", "--enable-early-stop", "--early-stop-config",
    "--lm_head-fp32", "--logits-processors", "--tensor-parallel-size", "--max-num-seqs",
    "--num-gpu-blocks-override", "--max-num-batched-tokens", "--gpu-memory-utilization", "--swap-space",
    "--enable-prefix-caching", "--enable-chunked-prefill", "--max-num-partial-prefills",
    "--max-long-partial-prefills", "--long-prefill-token-threshold", "--max-logprobs",
    "--speculative-config", "--use-cudagraph", "--guided-decoding-backend",
    "--guided-decoding-disable-any-whitespace", "--enable-expert-parallel", "--data-parallel-size",
    "--ips", "--splitwise-role", "--innode-prefill-ports", "--engine-worker-queue-port", "--pd-comm-port",
    "--cache-transfer-protocol",
]
_IMPLEMENTED_SERVER = [
    "--port", "--host", "--workers", "--metrics-port", "--max-waiting-time", "--max-concurrency",
    "--timeout-graceful-shutdown", "--api-key", "--reasoning-parser", "--tool-call-parser",
    "--tool-parser-plugin",
    # multimodal input (ERNIE-4.5-VL; fd_core.entrypoints.openai.mm_content)
    "--enable-mm", "--limit-mm-per-prompt", "--mm-processor-kwargs",
    # the global scheduler (fd_core.cluster)
    "--scheduler-name", "--scheduler-host", "--scheduler-port", "--scheduler-db", "--scheduler-password",
    "--scheduler-topic", "--scheduler-ttl", "--scheduler-min-load-score", "--scheduler-load-shards-num",
    "--scheduler-expire-period",
    "--router",  # register with fd-router (fd_core.router.announce)
]

FLAGS: list[Flag] = [
    *(Flag(name, "engine") for name in _IMPLEMENTED_ENGINE),
    *(Flag(name, "server") for name in _IMPLEMENTED_SERVER),
    # -- accepted, no effect here -------------------------------------------------
    _nf("--cache-queue-port", PORTS),
    _nf("--rdma-comm-ports", SPLITWISE_ONLY),
    _nf("--kv-cache-ratio", V0_SCHEDULER + " (prefill and decode share one KV pool)", type=float),
    _nf("--prealloc-dec-block-slot-num-threshold", V0_SCHEDULER, type=int),
    _nf("--static-decode-blocks", V0_SCHEDULER, type=int),
    _nf("--load-choices", "both of FastDeploy's loaders map to the one loader here, which reads "
        "safetensors tensor by tensor", aliases=("--load_choices",), values=("default", "default_v1")),
    _nf("--enable-logprob", "logprobs are always available; requests ask for them with logprobs", type=BOOL,
        values=(True, False)),
    _nf("--use-warmup", "the engine always warms up (one prefill and one decode) before serving", type=int),
    _nf("--enable-output-caching", "with prefix caching on, full blocks of output tokens are cached too; "
        "--no-enable-prefix-caching turns both off", type=parse_bool, nargs="?"),
    _nf("--disable-custom-all-reduce", "there is no custom all-reduce kernel; collectives go through the "
        "backend's communicator", type=BOOL),
    _nf("--enable-flashinfer-allreduce-fusion", "there is no flashinfer all-reduce here", type=BOOL),
    _nf("--disable-sequence-parallel-moe", "MoE layers do not use sequence parallelism here", type=BOOL),
    _nf("--shutdown-comm-group-if-worker-idle", "only used with dynamic weight loading (RL), which fd-core "
        "does not have", type=parse_bool, nargs="?"),
    _nf("--chunked-moe-size", "only used with --enable-chunked-moe", type=int),
    _nf("--write-policy", "only used with --kvcache-storage-backend"),
    _nf("--enable-overlap-schedule", "the engine does not overlap scheduling with the forward pass yet; "
        "steps run one after another", type=BOOL),
    _nf("--local-data-parallel-id", "one data-parallel rank only (parallelism: issue 17)", type=int),
    *(_nf(f"--scheduler-{n}", SPLITWISE_SCHEDULER, type=int) for n in [
        "sync-period", "release-load-expire-period", "reader-parallel", "writer-parallel",
        "reader-batch-size", "writer-batch-size"]),
    # -- features later issues build ------------------------------------------------
    _ny("--enable-eplb", "expert-parallel load balancing", 17, type=BOOL),
    _ny("--eplb-config", "expert-parallel load balancing", 17, type=parse_json_or_str),
    _ny("--use-internode-ll-two-stage", "expert parallelism across nodes", 17, type=BOOL),
    _ny("--kvcache-storage-backend", "a KV-cache storage backend", 18),
    _ny("--max-encoder-cache", "sizing the vision encoder cache by flag (it holds 65536 image tokens, least "
        "recently used out first)", 21, neutral=(None, -1), type=int),
    _ny("--max-processor-cache", "a cache of processed images in the API process", 21,
        neutral=(None, -1, -1.0), type=float),
    _ny("--disable-chunked-mm-input", "keeping an image's tokens in one prefill chunk (chunks may cut an image "
        "and stay exact)", 21, type=BOOL),
    _un("--enable-mm-output", "multimodal output (generated images) is not supported", type=BOOL),
    _ny("--graph-optimization-config", "graph capture (CUDA graphs)", 16, type=parse_json_or_str),
    # -- FastDeploy features fd-core does not offer ----------------------------------
    _un("--model-config-name", "fd-core reads the model's config.json; rename the file instead",
        neutral=(None, "config.json")),
    _un("--tokenizer-base-url", "a remote tokenizer service is not supported; the tokenizer runs in the "
        "API process"),
    _un("--task", "only text generation is served", neutral=(None, "generate")),
    _un("--runner", "only the generation runner exists", neutral=(None, "auto", "generate")),
    _un("--convert", "model conversion (e.g. to pooling) is not supported", neutral=(None, "auto", "none")),
    _un("--override-pooler-config", "pooling models are not supported", type=parse_json_or_str),
    _un("--model-impl", "the only model implementation is fd-core's own", neutral=(None, "auto", "fastdeploy")),
    _un("--dynamic-load-weight", "dynamic weight loading (RL) is not supported", type=BOOL),
    _un("--load-strategy", "dynamic weight loading (RL) is not supported", neutral=(None, "normal")),
    _un("--rsync-config", "dynamic weight loading (RL) is not supported", type=parse_json_or_str),
    _un("--routing-replay-config", "MoE routing replay (RL) is not supported", type=parse_json_or_str),
    _un("--plas-attention-config", "PLAS sparse attention is not supported", type=parse_json_or_str),
    _un("--enable-keep-sampling-mask", "returning the sampling mask is not supported", type=BOOL),
    _un("--enable-entropy", "per-token entropy output is not supported", type=BOOL),
    _un("--logprobs-mode", "logprobs are the model's raw log-softmax (raw_logprobs); requests can ask for "
        "temperature-scaled or top-p-normalized ones with temp_scaled_logprobs / top_p_normalized_logprobs",
        neutral=(None, "raw_logprobs")),
    _un("--enable-chunked-moe", "chunked MoE is not supported", type=BOOL),
    _un("--scheduler-max-size", "a bound on the local queue is not supported; use --max-concurrency",
        neutral=(None, -1), type=int),
    _un("--controller-port", "the scheduler controller API is not supported", neutral=(None, -1), type=int),
    _un("--timeout", "API workers are not restarted on silence here (no gunicorn)", neutral=(None, 0),
        type=int),
]

_BY_DEST = {f.dest: f for f in FLAGS}


def by_dest(dest: str) -> Flag | None:
    """The flag whose keyword-argument name (``max_model_len``) is ``dest``."""
    return _BY_DEST.get(dest.replace("-", "_"))


def check_flag(flag: Flag, value: Any) -> str | None:
    """For a flag the user gave: raise FlagError when fd-core cannot honour it,
    else return the INFO line to log (``no_effect``) or None."""
    given = f"{flag.name} {_show(value)}".rstrip()
    if flag.kind == "no_effect":
        if flag.values is not None and (value not in flag.values or type(value) is not type(flag.values[0])):
            raise ValueError(f"{flag.name} must be one of {', '.join(map(str, flag.values))}, got {value!r}")
        return f"{given} has no effect here: {flag.reason}"
    if flag.kind in ("not_yet", "unsupported") and value not in flag.neutral:
        if flag.name == "--graph-optimization-config" and not _enables_graphs(value):
            return None
        if flag.kind == "not_yet":
            raise FlagError(f"{given}: {flag.reason}")
        raise FlagError(f"{given} is not supported by fd-core: {flag.reason}")
    return None


def _enables_graphs(value: Any) -> bool:
    """graph_optimization_config turning graph capture off is accepted."""
    if isinstance(value, dict):
        return bool(value.get("use_cudagraph", True)) or bool(value.get("graph_opt_level", 0))
    return True


def _show(value: Any) -> str:
    if value is True:
        return ""
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."
