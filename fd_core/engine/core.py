"""The engine core: scheduler + model runner + sampler, one step at a time.

Token ids in, token ids out; no text. The offline ``LLMEngine`` drives it in
process; the server runs it in its own process behind IPC.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.backends import get_backend
from fd_core.config import (
    EngineArgs,
    UnsupportedFeatureError,
    host_available_bytes,
    host_swap_blocks,
    kv_cache_blocks,
)
from fd_core.engine.config import CacheConfig, SchedulerConfig
from fd_core.engine.guided import failed_output, finish_status, structured_outputs
from fd_core.engine.model_runner import ModelRunner, StepInput
from fd_core.engine.outputs import EngineCoreOutput, Logprob, PositionLogprobs
from fd_core.engine.request import EngineCoreRequest, Request, RequestStatus
from fd_core.engine.request_setup import default_seed, thinking_tokens
from fd_core.engine.scheduler import Scheduler
from fd_core.engine.speculative import SpeculativeDecoder
from fd_core.engine.speculative import step_input as speculative_step_input
from fd_core.model_loader import resolve_model_path
from fd_core.models.config import load_config
from fd_core.ops.decoder import DecoderSampling
from fd_core.parallel.driver import make_runner
from fd_core.quantization.config import (
    check_backend_supports,
    resolve_kv_cache_dtype,
)
from fd_core.quantization.offline import checkpoint_quantization
from fd_core.sampling.early_stop import EarlyStopConfig
from fd_core.sampling.logits_processors import (
    LogitsProcessorContext,
    check_request_args,
    load_logits_processors,
)
from fd_core.sampling.logprobs import Logprobs, compute_prompt_logprobs
from fd_core.sampling.sampler import Sampler, SamplingState
from fd_core.spec_decode.config import parse_speculative_config

__all__ = ["EngineCore", "EngineCoreRequest", "StepStats"]

logger = logging.getLogger(__name__)
paddle = import_paddle()
GIB = 1 << 30


@dataclass
class StepStats:
    """Counters of the last step, for metrics and benchmarks."""

    num_scheduled_tokens: int = 0
    num_decodes: int = 0
    num_prefill_tokens: int = 0
    forward_seconds: float = 0.0
    sample_seconds: float = 0.0
    step_seconds: float = 0.0


def _position_logprobs(entry: Logprobs) -> PositionLogprobs:
    out = {tok: Logprob(lp, rank=i + 1) for i, (tok, lp) in enumerate(entry.top)}
    out.setdefault(entry.token_id, Logprob(entry.logprob, rank=entry.rank))
    return out


def profiles_steps(device_type: str) -> bool:
    """Whether start-up measures the largest step's peak before sizing the KV pool:
    on accelerators, whose pool takes what the device has left (not on "cpu")."""
    return device_type != "cpu"


class EngineCore:
    """Owns the model, the KV cache, the scheduler and the sampler."""

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        if args.data_parallel_size > 1:
            raise UnsupportedFeatureError(
                f"data_parallel_size={args.data_parallel_size}: one engine core is one replica; fd-serve "
                f"--data-parallel-size {args.data_parallel_size} runs replicas behind one server (offline, "
                "start one LLM per replica)")
        # request features first: a bad flag fails before the model loads
        early_stop = EarlyStopConfig.from_args(args.enable_early_stop, args.early_stop_config)
        self.backend = get_backend(args.backend)
        self.model_dir = resolve_model_path(args.model, revision=args.revision)
        model_config = load_config(self.model_dir)
        processors = load_logits_processors(
            args.logits_processors,
            LogitsProcessorContext(model_config.vocab_size, self.backend.info.device_type),
        )
        if args.max_model_len > model_config.max_position_embeddings:
            raise ValueError(
                f"--max-model-len {args.max_model_len} exceeds the model's "
                f"max_position_embeddings {model_config.max_position_embeddings}"
            )
        self.model_config = model_config
        self.thinking = thinking_tokens(args.tokenizer or self.model_dir)
        # an offline-quantized checkpoint brings its own (fd_core.quantization.offline)
        self.quantization = checkpoint_quantization(self.model_dir, args.quantization, model_config.architecture,
                                                    lm_head_fp32=args.lm_head_fp32)
        kv_spec = self.quantization if getattr(self.quantization, "offline", None) else args.quantization
        if self.quantization is not None:
            check_backend_supports(self.backend.name, self.backend.capabilities().quantization_methods,
                                   self.quantization, model_config.is_moe)
        kv_dtypes = self.backend.capabilities().kv_cache_dtypes
        # an explicit KV dtype the backend lacks fails before the model loads
        resolve_kv_cache_dtype(args.kv_cache_dtype, kv_spec, self.backend.name, kv_dtypes)
        self.backend.set_device(0)
        # load the weights first, then size the KV cache from the memory they left
        self.runner = make_runner(  # a ModelRunner, or rank 0 of --tensor-parallel-size ranks
            ModelRunner, self.model_dir, self.backend, args.tensor_parallel_size,
            enable_expert_parallel=args.enable_expert_parallel, ips=args.ips, block_size=args.block_size,
            max_model_len=args.max_model_len, quantization=self.quantization, dtype=args.dtype,
            lm_head_fp32=args.lm_head_fp32,
        )
        kv_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, kv_spec, self.backend.name, kv_dtypes,
                                          self.runner.dtype)
        per_block = self.runner.kv_bytes_per_block(model_config, args.block_size, kv_dtype)  # per rank
        if getattr(parse_speculative_config(args.speculative_config), "method", None) == "mtp":
            per_block += per_block // model_config.num_layers  # the MTP block's KV layer (index L)
        memory = self.backend.memory(0)  # what the loaded weights left
        # on an accelerator the warm-up is the largest step the scheduler can issue, on a one-block
        # pool; its peak (activations, logits, attention workspaces) stays free beside the pool sized
        # from the rest. The CPU pool is sized by need under half the free host memory, which leaves
        # far more than a step's peak: profiling there would only cost start-up (11-25 s for the 0.3B)
        profiled = args.num_gpu_blocks_override is None and profiles_steps(self.backend.info.device_type)
        step_peak = self._profile(args, kv_dtype) if profiled else 0
        num_blocks = kv_cache_blocks(args, per_block, self.backend.info.device_type,
                                     memory.total_bytes, memory.free_bytes, step_peak)
        num_host_blocks = host_swap_blocks(
            args.swap_space, per_block, host_available_bytes(),
            num_blocks * per_block if self.backend.info.device_type == "cpu" else 0)
        if num_host_blocks and not args.enable_prefix_caching:
            # the host tier keeps evicted prefix-cache blocks: without prefix caching nothing goes there
            logger.info("--swap-space %g has no effect with prefix caching off (--no-enable-prefix-caching)",
                        args.swap_space)
            num_host_blocks = 0
        self.runner.allocate_kv_cache(num_blocks, num_host_blocks, kv_dtype)
        self.cache_config = CacheConfig(
            num_blocks=num_blocks, block_size=args.block_size, num_host_blocks=num_host_blocks,
            enable_prefix_caching=args.enable_prefix_caching,
        )
        self.scheduler_config = SchedulerConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.batched_tokens,
            max_model_len=args.max_model_len, enable_chunked_prefill=args.chunked_prefill,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
            max_num_partial_prefills=args.max_num_partial_prefills,
            max_long_partial_prefills=args.max_long_partial_prefills,
            num_scheduler_steps=args.num_scheduler_steps,
        )
        self.scheduler = Scheduler(self.scheduler_config, self.cache_config)
        if not profiled:
            self.runner.warmup()
        self.sampler = Sampler(self.backend.ops, model_config.vocab_size,
                               logits_processors=processors, early_stop=early_stop)
        spec_config = parse_speculative_config(args.speculative_config)
        self.spec = None if spec_config is None else SpeculativeDecoder(
            spec_config, model_config.vocab_size, args.max_model_len, early_stop=early_stop is not None,
            runner=self.runner, model_dir=self.model_dir)
        self.structured = structured_outputs(args, args.tokenizer or self.model_dir, model_config.vocab_size,
                                             model_config.eos_token_ids, self.thinking)
        self._num_unseeded = 0  # unseeded requests so far: k of default_seed(args.seed, k)
        self._states: dict[str, SamplingState] = {}
        self._prompt_logprobs: dict[str, list[PositionLogprobs | None]] = {}
        self._pending: list[EngineCoreOutput] = []  # outputs produced outside a step (aborts)
        self._mm_inputs: dict[str, Any] = {}  # request id -> its MultiModalInputs (prompts with images)
        self.last_step = StepStats()
        logger.info(
            "engine ready: backend %s, %d KV blocks of %d tokens (%d tokens, %s, %.2f GiB), %d host blocks",
            self.backend.name, num_blocks, args.block_size, num_blocks * args.block_size, kv_dtype,
            num_blocks * per_block / GIB, num_host_blocks,
        )

    def _profile(self, args: EngineArgs, kv_dtype: str) -> int:
        """Run the profiling warm-up; its peak memory in bytes."""
        start = time.perf_counter()
        peak = self.runner.profile_run(args.batched_tokens, args.max_num_seqs, kv_dtype)
        logger.info("profiling step (%d batched tokens, %d decode rows of %d tokens): peak %.1f MiB in %.2f s",
                    args.batched_tokens, min(args.max_num_seqs, args.batched_tokens), args.max_model_len,
                    peak / (1 << 20), time.perf_counter() - start)
        return peak

    # ---------------------------------------------------------- requests

    def add_request(self, req: EngineCoreRequest) -> None:
        """Validate and queue a request; raises ValueError naming the problem."""
        vocab = self.model_config.vocab_size
        bad = [t for t in req.prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
        params = req.sampling_params
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            if asked is not None and asked > self.args.max_logprobs:
                raise ValueError(f"{name} {asked} is more than this server allows: at most "
                                 f"{self.args.max_logprobs} (--max-logprobs)")
        check_request_args(self.sampler.logits_processors, params.logits_processors_args)
        seeded_by_engine = params.seed is None and self.args.seed is not None
        if seeded_by_engine:
            assert self.args.seed is not None
            params = params.replace(seed=default_seed(self.args.seed, self._num_unseeded))
        mm = req.mm_inputs  # images: their hashes key the prefix cache's blocks
        request = Request(
            req.request_id, req.prompt_token_ids, params, req.eos_token_ids,
            arrival_time=req.arrival_time, cache_salt=req.cache_salt,
            mm_hashes=mm.hashes if mm is not None else (), mm_positions=mm.placeholder_ranges if mm is not None else (),
        )
        if mm is not None:
            self._mm_inputs[req.request_id] = mm
        state = SamplingState.create(
            params, req.prompt_token_ids, eos_token_ids=req.eos_token_ids,
            bad_words_token_ids=req.bad_words_token_ids,
            output_token_ids=request.output_token_ids, vocab_size=vocab, thinking=self.thinking,
        )
        request.multi_step = self._may_multi_step(state)
        if params.guided_decoding is None:
            self.scheduler.add_request(request)
        else:  # held until its grammar compiled (GrammarError, a ValueError, for a bad one)
            self.structured.add(req.request_id, params.guided_decoding, request, request.output_token_ids,
                                req.prompt_token_ids, state.reasoning)
        self._states[req.request_id] = state
        if self.spec is not None:
            self.spec.add_request(req.request_id, req.prompt_token_ids, state, params.guided_decoding is not None,
                                  multimodal=mm is not None)
        if seeded_by_engine:
            self._num_unseeded += 1

    def _may_multi_step(self, state: SamplingState) -> bool:
        """Whether the request's decodes may run several steps in one schedule (--num-scheduler-steps):
        a request whose next token depends on nothing but the logits and its own draw (greedy, or sampled
        with temperature / top-k / top-p / min-p; no bias, bad words, penalties, logits processors, grammar,
        thinking budget, logprobs or early stop), with no speculative decoding (it drafts and verifies its own
        steps). ``min_tokens`` bans the stop tokens only before that many outputs: the scheduler runs such a
        request one step a schedule until then, where it bans any (``Scheduler._num_steps``). Stop strings
        do not prevent it: they are matched on the text outside the core, which takes a schedule's tokens one
        at a time and drops those after the stop (``OutputProcessor``); the core computed them for nothing
        (the rest of the schedule, and in the server, where the abort crosses a socket, possibly one more)."""
        p = state.params
        return (self.scheduler_config.num_scheduler_steps > 1 and self.spec is None
                and not self.sampler.logits_processors and self.sampler.early_stop is None
                and p.guided_decoding is None and p.logprobs is None and not p.has_penalties and not p.logit_bias
                and not state.bad_words_token_ids and state.reasoning is None)

    def _multi_step(self, step: StepInput, scheduled: list[Any]) -> dict[str, list[int]]:
        """Run a multi-step schedule: ``scheduled[0].num_steps`` decode steps from ``step``, each request's
        token fed to the next; request id -> its tokens, one a step. One backend call where the model and
        a plugin run them together (``ModelRunner.execute_steps``), else a forward and the sampler a step
        (the same tokens). A sampled request's uniforms for every step are drawn first, in its generator's
        order: its tokens are those of one step a schedule (a request that stops early has drawn for steps
        it never takes; it draws no more)."""
        num_steps = scheduled[0].num_steps
        states = [self._states[s.request_id] for s in scheduled]
        sampling, uniforms = None, None
        if not all(state.params.greedy for state in states):
            uniforms = np.stack([self.sampler.draw_uniforms(states) for _ in range(num_steps)])
            temperature, top_k, top_p, min_p = (paddle.to_tensor(x) for x in self.sampler.row_params(states))
            sampling = DecoderSampling(temperature, top_k, top_p, min_p, paddle.to_tensor(uniforms),
                                       self.sampler.method)
        tokens = self.runner.execute_steps(step, num_steps, sampling)
        if tokens is None:
            tokens = []
            for i in range(num_steps):
                if i:
                    step = StepInput(token_ids=[[t] for t in tokens[-1]], seq_lens=[n + 1 for n in step.seq_lens],
                                     block_tables=step.block_tables, num_decodes=step.num_decodes,
                                     needs_logits=step.needs_logits)
                tokens.append(self.sampler.sample(self.runner.execute(step), states,
                                                  uniforms=None if uniforms is None else uniforms[i]).sampled_token_ids)
        return {s.request_id: [row[j] for row in tokens] for j, s in enumerate(scheduled)}

    def abort(self, request_ids: list[str], reason: RequestStatus = RequestStatus.FINISHED_ABORTED,
              stop_reason: int | str | None = None) -> None:
        """Finish requests now (client abort, or a stop string found outside)."""
        if self.spec is not None:
            for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
                self.spec.finish(rid, keep_output=reason != RequestStatus.FINISHED_ABORTED)
        for req in self.scheduler.finish_requests(request_ids, reason, stop_reason):
            self._drop(req.request_id)
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            self._drop(rid)  # held for its grammar: not in the scheduler yet

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self.structured.has_held()

    def _drop(self, request_id: str) -> None:
        self.structured.drop(request_id)
        self._states.pop(request_id, None)
        self._prompt_logprobs.pop(request_id, None)
        self._mm_inputs.pop(request_id, None)
        if self.spec is not None:
            self.spec.finish(request_id)

    # -------------------------------------------------------------- step

    def step(self) -> list[EngineCoreOutput]:
        """Schedule, run the forward, sample, update; returns new tokens."""
        start = time.perf_counter()
        ready, failed = self.structured.admit(0.0 if self.scheduler.has_unfinished_requests() else 0.005)
        for request in ready:
            self.scheduler.add_request(request)
        for request, error in failed:
            self._pending.append(failed_output(request, error))
            self._drop(request.request_id)
        out = self.scheduler.schedule()
        stats = StepStats()
        if out.swap_out or out.swap_in:
            self.runner.apply_swaps(out.swap_out, out.swap_in)
        sampled: dict[str, list[int]] = {}
        new_logprobs: dict[str, list[PositionLogprobs]] = {}
        early_stopped: set[str] = set()
        grammar_ended: dict[str, str | None] = {}
        verified: list[tuple[Any, int]] = []  # (scheduled request with drafts, its first row)
        scheduled = out.scheduled
        if scheduled and scheduled[0].num_steps > 1:  # multi-step: every request decodes
            step = StepInput(token_ids=[s.token_ids for s in scheduled], seq_lens=[s.seq_len for s in scheduled],
                             block_tables=[s.block_ids for s in scheduled], num_decodes=out.num_decodes,
                             needs_logits=[True] * len(scheduled))
            sampled = self._multi_step(step, scheduled)
            stats.forward_seconds = time.perf_counter() - start
        elif scheduled:
            wants_prompt = [self._wants_prompt_logprobs(s) for s in scheduled]
            drafted = [s.num_draft_tokens > 0 for s in scheduled]  # speculative: every row scored
            mm_inputs = [self._mm_inputs.get(s.request_id) for s in scheduled] if self._mm_inputs else []
            step = StepInput(
                token_ids=[s.token_ids for s in scheduled],
                seq_lens=[s.seq_len for s in scheduled],
                block_tables=[s.block_ids for s in scheduled],
                num_decodes=out.num_decodes,
                needs_logits=[s.samples for s in scheduled],
                all_logits=wants_prompt,
                mm_inputs=mm_inputs,
            ) if not any(drafted) else speculative_step_input(scheduled, out.num_decodes, wants_prompt, mm_inputs)
            logits = self.runner.execute(step)  # None when no request needs logits
            stats.forward_seconds = time.perf_counter() - start
            rows, states, row = [], [], 0
            for s, whole, draft in zip(scheduled, wants_prompt, drafted):
                if draft:
                    verified.append((s, row))
                    row += s.num_tokens
                elif whole:
                    self._record_prompt_logprobs(s, logits[row : row + s.num_tokens])
                    row += s.num_tokens
                    if s.samples:
                        rows.append(row - 1)
                        states.append(self._states[s.request_id])
                elif s.samples:
                    rows.append(row)
                    states.append(self._states[s.request_id])
                    row += 1
            if states and logits is not None:
                t0 = time.perf_counter()
                sample_logits = logits if len(rows) == int(logits.shape[0]) else logits[rows]
                ids = [s.request_id for s, d in zip(scheduled, drafted) if s.samples and not d]
                mask = self.structured.bitmask(ids)
                result = self.sampler.sample(sample_logits, states, mask)
                if mask is not None:
                    grammar_ended = self.structured.accept(ids, result.sampled_token_ids)
                stats.sample_seconds = time.perf_counter() - t0
                for rid, tok, lp in zip(ids, result.sampled_token_ids, result.logprobs):
                    sampled[rid] = [tok]
                    if lp is not None:
                        new_logprobs[rid] = [_position_logprobs(lp)]
                early_stopped = {rid for rid, hit in zip(ids, result.early_stopped) if hit}
            if verified and self.spec is not None:
                t0 = time.perf_counter()
                tokens, spec_logprobs = self.spec.verify(logits, verified)
                sampled.update(tokens)
                for rid, entries in spec_logprobs.items():
                    new_logprobs[rid] = [_position_logprobs(e) for e in entries]
                stats.sample_seconds += time.perf_counter() - t0
        updates = self.scheduler.update_from_output(out, sampled)
        spec_step: dict[str, tuple[int, int]] = {}  # request id -> (drafted, accepted) this step
        if self.spec is not None:
            spec_step = self.spec.last_step if verified else {}
            self.spec.after_update(updates, self.scheduler, scheduled)
        now = time.time()
        outputs = self._pending
        self._pending = []
        for update in updates:
            req = update.request
            rid = req.request_id
            finished = update.finished
            if rid in early_stopped and not finished:
                # repetition early stop: the token is kept, the request ends as "stop"
                self.scheduler.finish_requests(rid, RequestStatus.FINISHED_STOPPED)
                finished = True
            if rid in grammar_ended and not finished:  # grammar complete (stop) or a token it refused
                self.scheduler.finish_requests(rid, finish_status(grammar_ended[rid]), grammar_ended[rid])
                finished = True
            events = {"scheduled": now}
            output = EngineCoreOutput(
                request_id=rid,
                new_token_ids=update.new_token_ids,
                new_logprobs=(new_logprobs[rid][: len(update.new_token_ids)]
                              if rid in new_logprobs and update.new_token_ids else None),
                finish_reason=req.finish_reason if finished else None,
                stop_reason=req.stop_reason if finished else None,
                num_cached_tokens=req.num_cached_tokens,
                num_draft_tokens=spec_step.get(rid, (0, 0))[0],
                num_accepted_tokens=spec_step.get(rid, (0, 0))[1],
                events=events,
            )
            if rid in self._prompt_logprobs and req.num_output_tokens == 1:
                output.prompt_logprobs = self._prompt_logprobs[rid]
            outputs.append(output)
            if finished:
                self._drop(rid)
        stats.num_scheduled_tokens = out.total_num_scheduled_tokens
        stats.num_decodes = out.num_decodes
        stats.num_prefill_tokens = out.total_num_scheduled_tokens - out.num_decodes
        stats.step_seconds = time.perf_counter() - start
        self.last_step = stats
        return outputs

    # ------------------------------------------------------ prompt logprobs

    def _wants_prompt_logprobs(self, s: Any) -> bool:
        state = self._states.get(s.request_id)
        if state is None or state.params.prompt_logprobs is None:
            return False
        num_prompt = len(state.prompt_token_ids)
        if s.num_computed_tokens >= num_prompt:
            return False
        done = self._prompt_logprobs.get(s.request_id)
        # after a preemption the prompt is recomputed: keep what we have
        return done is None or len(done) < num_prompt

    def _record_prompt_logprobs(self, s: Any, logits: Any) -> None:
        state = self._states[s.request_id]
        prompt = list(state.prompt_token_ids)
        start = s.num_computed_tokens
        end = min(start + s.num_tokens, len(prompt))
        rows = end - start
        # row i predicts prompt[start + i + 1]; the last prompt row predicts output
        tokens = prompt[start : min(end + 1, len(prompt))]
        usable = min(rows, len(tokens) - 1) if end == len(prompt) else rows
        done = self._prompt_logprobs.setdefault(s.request_id, [None])
        if usable <= 0 or len(done) - 1 != start:
            return
        k = state.params.prompt_logprobs or 0
        entries = compute_prompt_logprobs(logits[:usable], tokens[: usable + 1], k)
        done.extend(_position_logprobs(e) for e in entries)
