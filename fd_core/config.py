"""Engine arguments with FastDeploy's names, and sizing the KV cache.

``EngineArgs`` is what users give (``LLM(**kwargs)``, ``fd-serve`` flags);
it is validated here and turned into the small per-component configs
(``CacheConfig``, ``SchedulerConfig``) only at this boundary. Components
never see the whole argument set.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from fd_core import envs
from fd_core.errors import UnsupportedFeatureError
from fd_core.flags import by_dest, check_flag
from fd_core.quantization.config import kv_cache_dtype_from_quantization, parse_quantization
from fd_core.sampling.early_stop import EarlyStopConfig
from fd_core.tokenizer.chat_template import ChatTemplate, load_chat_template

__all__ = ["EngineArgs", "UnsupportedFeatureError", "host_available_bytes", "host_memory", "host_swap_blocks", "kv_cache_blocks"]

GIB = 1 << 30
DTYPES = ("auto", "bfloat16", "float16", "float32")  # --dtype
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "int8", "fp8")  # --kv-cache-dtype
GUIDED_DECODING_BACKENDS = ("auto", "llguidance", "xgrammar", "off")  # --guided-decoding-backend
SWAP_FRACTION = 0.5  # --swap-space may take at most this share of the host memory available
# the CPU backends' KV pool takes at most this share of the host memory left after the weights
# (and at most --gpu-memory-utilization of it): host memory is shared with the API processes,
# activations and the rest of the machine, unlike an accelerator's
CPU_KV_SHARE = 0.5

logger = logging.getLogger(__name__)


@dataclass
class EngineArgs:
    model: str
    tokenizer: str | None = None  # defaults to the model directory
    served_model_name: str | None = None
    backend: str = "auto"  # auto, cpu, cuda, xpu, iluvatar, dcu, gcu, or a plugin's name
    max_model_len: int = 2048  # FastDeploy's default
    max_num_seqs: int = 8  # FastDeploy's default
    max_num_batched_tokens: int | None = None  # default: 2048 (chunked) or max_model_len
    block_size: int = 64
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    swap_space: float = 0.0  # GiB of host memory for evicted prefix-cache blocks
    enable_chunked_prefill: bool | None = None  # default on unless FD_DISABLE_CHUNKED_PREFILL=1
    tensor_parallel_size: int = 1
    # --enable-expert-parallel: a MoE model's routed experts partitioned over the TP ranks
    # (fd_core.parallel.expert_parallel); attention and shared experts stay tensor-parallel
    enable_expert_parallel: bool = False
    # --data-parallel-size: engine replicas behind one API server (fd_core.engine.dp_client);
    # each engine core is one replica and runs with 1 here
    data_parallel_size: int = 1
    # --ips: the hosts of a multi-node --tensor-parallel-size, the first the master
    # (fd_core.parallel.multinode); a list or FastDeploy's comma-separated text
    ips: str | list[str] | None = None
    quantization: str | dict[str, Any] | None = None
    use_cudagraph: bool = False
    speculative_config: str | dict[str, Any] | None = None
    chat_template: str | None = None
    # default seed of requests that give none: request k (in arrival order) samples
    # with seed (seed, k), so a seeded server answers the same request stream alike;
    # None = fresh OS entropy per unseeded request
    seed: int | None = None
    disable_log_stats: bool = False
    revision: str | None = None  # hub revision (branch, tag or commit) of --model
    # scheduler: with chunked prefill, a prompt longer than long_prefill_token_threshold
    # is "long"; at most max_num_partial_prefills prompts are mid-prefill in one step,
    # at most max_long_partial_prefills of them long (vLLM / FastDeploy meaning)
    long_prefill_token_threshold: int = 0  # 0 = 4% of max_model_len when partial prefills > 1, else off
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    # multi-step decoding: a schedule whose requests all decode greedily runs up to this many
    # forward steps, each token fed to the next, before the engine's Python runs again (vLLM's
    # --num-scheduler-steps; fd_core.engine.scheduler, EngineCore._multi_step); 1 = off
    num_scheduler_steps: int = 1
    lm_head_fp32: bool = False  # keep the LM head (and its matmul) in fp32 whatever the quantization
    # FastDeploy's repetition early stop: stop a request whose sampled token has had
    # probability > threshold for window_size consecutive steps (finish_reason "stop")
    enable_early_stop: bool = False
    early_stop_config: dict[str, Any] | str | None = None  # {"strategy": "repetition", "window_size": 3000, "threshold": 0.99}
    # logits processor classes ("module:Class" or "module.Class") loaded in the engine;
    # requests switch them on with logits_processors_args
    logits_processors: list[str] | None = None
    max_logprobs: int = 20  # top logprobs a request may ask for (FastDeploy's --max-logprobs; at most 20)
    # --dtype: the weights' storage dtype; "auto" is the checkpoint's where the backend computes in it
    dtype: str = "auto"
    # --kv-cache-dtype: the KV cache's dtype; "auto" follows the model's compute dtype. FastDeploy's
    # form, quantization={"kv_cache_quant_type": ...}, sets it too (int8, float8_e4m3fn, block_wise_fp8)
    kv_cache_dtype: str = "auto"
    # structured output: the grammar engine (auto = llguidance; off refuses constrained requests)
    guided_decoding_backend: str = "auto"
    guided_decoding_disable_any_whitespace: bool = False  # JSON constraints allow no free whitespace
    # prefill/decode disaggregation (fd_core.disagg): mixed, prefill or decode; a prefill instance
    # serves KV-transfer tasks on 127.0.0.1:engine_worker_queue_port (and *:pd_comm_port), a decode
    # instance sends them to innode_prefill_ports ("8182,host:8182"); cache_transfer_protocol: tcp
    # or a protocol a backend brings
    splitwise_role: str = "mixed"
    innode_prefill_ports: str | list[Any] | None = None
    engine_worker_queue_port: str | int | list[Any] | None = None
    pd_comm_port: str | int | list[Any] | None = None
    cache_transfer_protocol: str | None = None
    # (core, args) -> what the engine drives in the core's place; set by fd_core.entrypoints for
    # --splitwise-role prefill/decode (fd_core.disagg.engine.disaggregate), None: the core itself
    core_wrapper: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        """Build from keyword arguments (``LLM(**kwargs)``, the CLI).

        FastDeploy's flag names are all known (fd_core/flags.py): one with no
        effect here is logged at INFO and dropped, a server-only one likewise
        (nothing serves HTTP offline), one naming a feature fd-core lacks raises
        UnsupportedFeatureError naming it; any other unknown name is a TypeError.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = []
        for name in sorted(set(kwargs) - names):
            flag = by_dest(name)
            if flag is None:
                unknown.append(name)
                continue
            value = kwargs.pop(name)
            if flag.kind == "server":
                logger.info("%s has no effect on the offline engine: it configures the HTTP server", name)
                continue
            note = check_flag(flag, value)  # raises FlagError, an UnsupportedFeatureError
            if note:
                logger.info("%s", note)
        if unknown:
            raise TypeError(
                f"unknown engine argument(s) {', '.join(unknown)}; known: {', '.join(sorted(names - {'extra'}))} "
                "and FastDeploy's other flag names"
            )
        args = cls(model=model, **kwargs)
        args.validate()
        return args

    def validate(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")

        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                     "num_gpu_blocks_override", "tensor_parallel_size", "data_parallel_size",
                     "max_num_partial_prefills",
                     "max_long_partial_prefills", "num_scheduler_steps"):
            positive(name)
        if not isinstance(self.long_prefill_token_threshold, int) or self.long_prefill_token_threshold < 0:
            raise ValueError("--long-prefill-token-threshold must be an integer >= 0, got "
                             f"{self.long_prefill_token_threshold!r}")
        if not isinstance(self.max_logprobs, int) or not 0 <= self.max_logprobs <= 20:
            raise ValueError(f"--max-logprobs must be in [0, 20] (fd-core returns at most 20 top logprobs; "
                             f"-1, the whole vocabulary, is not supported), got {self.max_logprobs!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"--seed must be an integer, got {self.seed!r}")
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError(
                f"--max-long-partial-prefills {self.max_long_partial_prefills} exceeds "
                f"--max-num-partial-prefills {self.max_num_partial_prefills}; it counts a subset of them"
            )
        if self.num_scheduler_steps > 1 and self.speculative_config is not None:
            raise ValueError(f"--num-scheduler-steps {self.num_scheduler_steps} with --speculative-config: "
                             "speculative decoding runs its own steps (drafts, then one verifying forward); "
                             "use one or the other")
        EarlyStopConfig.from_args(self.enable_early_stop, self.early_stop_config)  # names a bad key or value
        self._check_logits_processor_modules()
        if self.chat_template is not None:
            import jinja2

            try:
                ChatTemplate(load_chat_template(self.chat_template))  # a file that is there, and compiles
            except jinja2.TemplateSyntaxError as exc:
                raise ValueError(f"--chat-template: not a valid jinja template: {exc}") from None
            except OSError as exc:
                raise ValueError(f"--chat-template {self.chat_template!r}: {exc}") from None
        if self.logits_processors is not None and (
                not isinstance(self.logits_processors, (list, tuple))
                or not all(isinstance(x, str) and x for x in self.logits_processors)):
            raise ValueError(f"--logits-processors must be a list of class paths (module:Class), "
                             f"got {self.logits_processors!r}")
        if self.guided_decoding_backend not in GUIDED_DECODING_BACKENDS:
            raise ValueError(f"--guided-decoding-backend must be one of {', '.join(GUIDED_DECODING_BACKENDS)}, "
                             f"got {self.guided_decoding_backend!r}")
        if not isinstance(self.guided_decoding_disable_any_whitespace, bool):
            raise ValueError("--guided-decoding-disable-any-whitespace must be true or false, got "
                             f"{self.guided_decoding_disable_any_whitespace!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.swap_space < 0:
            raise ValueError(f"--swap-space must be >= 0 GiB, got {self.swap_space}")
        if not isinstance(self.enable_expert_parallel, bool):
            raise ValueError(f"--enable-expert-parallel must be true or false, got {self.enable_expert_parallel!r}")
        # --tensor-parallel-size N > 1 runs N ranks (fd_core.parallel); whether N splits the model's
        # heads, KV heads, vocabulary and intermediate sizes is checked against its config at engine start
        parse_quantization(self.quantization, lm_head_fp32=self.lm_head_fp32)  # raises naming an unknown or unimplemented method
        quant_kv = kv_cache_dtype_from_quantization(self.quantization)
        if self.kv_cache_dtype != "auto" and quant_kv and quant_kv != self.kv_cache_dtype:
            raise ValueError(f"--kv-cache-dtype {self.kv_cache_dtype} and --quantization kv_cache_quant_type "
                             f"({quant_kv}) disagree; give one of the two")
        if self.use_cudagraph:
            raise UnsupportedFeatureError("--use-cudagraph: graph capture (CUDA graphs) is not implemented yet "
                                          "(issue 16)")
        self._check_speculative_config()

    def _check_speculative_config(self) -> None:
        """--speculative-config parses (keys and values named when wrong); MTP
        drafts on one device (the engine checks the model and its MTP weights)."""
        from fd_core.spec_decode.config import parse_speculative_config

        spec = parse_speculative_config(self.speculative_config)
        if spec is not None and spec.method == "mtp" and self.tensor_parallel_size > 1:
            raise UnsupportedFeatureError(
                f"--speculative-config method 'mtp' with --tensor-parallel-size {self.tensor_parallel_size}: "
                "the MTP drafter runs on one device; use --tensor-parallel-size 1 or method 'ngram' / 'suffix'"
            )
        role = (self.splitwise_role or "mixed").strip().lower()
        if spec is not None and spec.method == "mtp" and role != "mixed":
            raise UnsupportedFeatureError(
                f"--speculative-config method 'mtp' with --splitwise-role {role}: the MTP block's KV layer is not "
                "computed by the prefill side nor carried by the KV transfer yet; use method 'ngram' / 'suffix' "
                "or --splitwise-role mixed"
            )

    def _check_logits_processor_modules(self) -> None:
        """Each --logits-processors module exists (found, not imported: the API
        process imports no paddle; the engine imports and checks the classes)."""
        import importlib.util

        for spec in self.logits_processors or ():
            if not isinstance(spec, str):
                continue
            module = spec.partition(":")[0] if ":" in spec else spec.rpartition(".")[0]
            if not module or module.startswith("fastdeploy."):
                continue  # a built-in name, or FastDeploy's path to one
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                raise ValueError(f"--logits-processors {spec!r}: no module named {module!r}")

    @property
    def chunked_prefill(self) -> bool:
        if self.enable_chunked_prefill is not None:
            return self.enable_chunked_prefill
        return not envs.get("FD_DISABLE_CHUNKED_PREFILL")

    @property
    def batched_tokens(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.chunked_prefill else max(2048, self.max_model_len)


def kv_cache_blocks(
    args: EngineArgs, bytes_per_block: int, device_type: str, total_bytes: int, free_bytes: int,
    activation_bytes: int = 0,
) -> int:
    """How many KV blocks to allocate (block 0, the null block, included).

    ``total_bytes`` / ``free_bytes``: the device's memory once the weights are
    loaded; ``activation_bytes``: the peak the engine's profiling step (the
    largest step the scheduler can issue) took beyond that, which every
    budget below leaves free.

    ``--num-gpu-blocks-override`` wins. On accelerators the cache gets
    ``total * gpu_memory_utilization`` minus what is in use (model weights
    included) minus the profiling step's peak.

    On the CPU backend the cache is host memory shared with everything else,
    so it takes what the model needs, not all it could: room for
    ``max_num_seqs`` sequences of ``max_model_len`` tokens
    (``ceil(max_model_len / block_size) * max_num_seqs`` blocks), 25% more
    with prefix caching (freed prefixes then survive while a full batch of
    full-length requests runs), plus the null block. That is capped by the
    budget: ``min(gpu_memory_utilization, CPU_KV_SHARE)`` of the host memory
    free once the weights are loaded, less the profiling step's peak, and
    ``FD_CPU_KVCACHE_SPACE`` GiB when set (unset = no cap beyond the first).
    Under the cap the scheduler preempts when blocks run out. A budget that
    cannot hold one ``max_model_len`` sequence raises ``ValueError`` naming
    the numbers and what to change.
    """
    if args.num_gpu_blocks_override is not None:
        return args.num_gpu_blocks_override
    if device_type != "cpu":
        budget = int(total_bytes * args.gpu_memory_utilization) - (total_bytes - free_bytes) - activation_bytes
        blocks = budget // bytes_per_block
        if blocks < 2:
            raise ValueError(
                f"no memory left for the KV cache: budget {budget / GIB:.2f} GiB "
                f"({args.gpu_memory_utilization:g} of {total_bytes / GIB:.2f} GiB, less "
                f"{(total_bytes - free_bytes) / GIB:.2f} GiB in use and a "
                f"{activation_bytes / GIB:.2f} GiB step peak), one block needs "
                f"{bytes_per_block / (1 << 20):.1f} MiB; raise --gpu-memory-utilization, "
                "or set --num-gpu-blocks-override"
            )
        return int(blocks)
    per_seq = -(-args.max_model_len // args.block_size)
    need = per_seq * args.max_num_seqs
    wanted = (-(-need * 5 // 4) if args.enable_prefix_caching else need) + 1  # + the null block
    share = min(args.gpu_memory_utilization, CPU_KV_SHARE)
    budget = int(free_bytes * share) - activation_bytes
    limit = (f"--gpu-memory-utilization {args.gpu_memory_utilization} of {free_bytes / GIB:.2f} GiB free"
             if share == args.gpu_memory_utilization else
             f"{CPU_KV_SHARE:g} of the {free_bytes / GIB:.2f} GiB of host memory free after the weights")
    if activation_bytes:
        limit += (f", less the {activation_bytes / GIB:.2f} GiB peak of the largest step, which "
                  "--max-num-batched-tokens and --max-num-seqs bound")
    space = envs.get("FD_CPU_KVCACHE_SPACE")  # GiB, or None: size to need
    if space is not None and space * GIB < budget:
        budget = int(space * GIB)
        limit = f"FD_CPU_KVCACHE_SPACE {space:g} GiB"
    budget = max(0, budget)
    blocks = budget // bytes_per_block
    if blocks < per_seq + 1:
        raise ValueError(
            f"the KV cache budget of {budget / GIB:.2f} GiB ({limit}) holds {blocks} blocks of "
            f"{args.block_size} tokens ({bytes_per_block / (1 << 20):.1f} MiB each), but one "
            f"--max-model-len {args.max_model_len} sequence needs {per_seq} blocks plus the reserved "
            f"null block ({(per_seq + 1) * bytes_per_block / GIB:.2f} GiB); lower --max-model-len, "
            "raise --gpu-memory-utilization or FD_CPU_KVCACHE_SPACE, free host memory, "
            "or set --num-gpu-blocks-override"
        )
    return int(min(wanted, blocks))


def host_memory() -> tuple[int, int]:
    """(MemTotal, MemAvailable) of this host in bytes; 0 for what /proc/meminfo does not say."""
    total = available = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                if key == "MemTotal":
                    total = int(value.split()[0]) * 1024
                elif key == "MemAvailable":
                    available = int(value.split()[0]) * 1024
    except OSError:
        pass
    return total, available


def host_available_bytes() -> int:
    """MemAvailable of this host (0 when unknown)."""
    return host_memory()[1]


def host_swap_blocks(swap_space_gib: float, bytes_per_block: int, available_bytes: int,
                     reserved_bytes: int = 0) -> int:
    """Blocks of the host (swap) tier for ``--swap-space`` GiB.

    FastDeploy's pages recommend ``--swap-space 50``; on a smaller machine that
    would exhaust host memory, so the tier is clamped, with a warning, to
    SWAP_FRACTION of the host memory available after ``reserved_bytes`` (the CPU
    backend's own KV pool lives in host memory too). ``available_bytes`` 0 means
    unknown: no clamp.
    """
    wanted = int(swap_space_gib * GIB)
    if wanted <= 0:
        return 0
    if available_bytes > 0:
        cap = max(0, int((available_bytes - reserved_bytes) * SWAP_FRACTION))
        if wanted > cap:
            logger.warning(
                "--swap-space %g GiB is more than this host can spare: %.2f GiB available%s, of which "
                "at most %d%% goes to the swap tier; using %.2f GiB",
                swap_space_gib, available_bytes / GIB,
                f" after the {reserved_bytes / GIB:.2f} GiB KV pool" if reserved_bytes else "",
                int(SWAP_FRACTION * 100), cap / GIB,
            )
            wanted = cap
    return wanted // bytes_per_block
