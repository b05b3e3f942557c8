"""The token-budget scheduler (vLLM v1 / FastDeploy v1 style). Pure Python.

Each step: running requests first, in admission order (a decode takes one
token, a request mid-prefill its next chunk), then waiting requests in FCFS
order with their prefix-cache hits subtracted, while the token budget
(``max_num_batched_tokens``) and ``max_num_seqs`` allow. When a running
request cannot get a block, the most recently admitted running request is
preempted: its blocks are freed and it goes back to the *front* of the
waiting queue, to be recomputed (prompt + outputs so far) when re-admitted.
A step that preempted admits nobody.

Speculative decoding: the engine core hands a running request's draft tokens
in with ``set_draft_token_ids`` after a step; the next ``schedule`` gives a
request that is decoding ``1 + d`` tokens (its last token, then the drafts),
counted in the budget, with the drafts cut to the budget, ``max_model_len``
and, when blocks run short, to none before anyone is preempted.
``update_from_output`` takes the verified tokens (accepted drafts, then the
target's token) and rolls the rest back: ``num_computed_tokens`` counts only
verified tokens, the prefix cache registers only blocks full of them, and
blocks that held only rejected drafts go back to the pool.

Multi-step decoding (``num_scheduler_steps`` > 1): when every running
request is decoding, may (``Request.multi_step``: the engine core's requests
whose tokens need nothing but the logits and their own draw) and nobody waits who could be admitted, each gets the same
``num_steps`` forward steps in one schedule (cut to its ``max_tokens`` and
``max_model_len``, and to 1 when the free blocks cannot hold every step's
slot); ``update_from_output`` then takes that many tokens, up to a stop.

Called by the engine core, in a loop: ``add_request`` / ``abort`` /
``finish_requests`` as messages arrive, then ``schedule`` -> run the model ->
``update_from_output``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from fd_core.engine.config import CacheConfig, SchedulerConfig
from fd_core.engine.kv_cache_manager import KVCacheManager
from fd_core.engine.partial_prefills import PartialPrefills
from fd_core.engine.request import Request, RequestStatus
from fd_core.engine.scheduler_output import (
    RequestUpdate,
    ScheduledRequest,
    SchedulerOutput,
    SchedulerStats,
)

__all__ = ["Scheduler"]

logger = logging.getLogger(__name__)


class Scheduler:
    """Decides, each step, which requests run and how many tokens each computes."""

    def __init__(self, config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.config = config
        self.kv_cache_manager = KVCacheManager(cache_config)
        self.block_size = cache_config.block_size
        self.requests: dict[str, Request] = {}  # request id -> every unfinished request
        self.waiting: deque[Request] = deque()  # FCFS; preempted requests re-enter at the front
        self.running: list[Request] = []  # admission order
        self._finished_ids: list[str] = []  # since the last schedule()
        self._draft_token_ids: dict[str, list[int]] = {}  # request id -> drafts for the next step
        self._held: set[str] = set()  # requests prefilled elsewhere (fd_core.disagg), in neither queue
        self.num_preemptions = 0
        self._last_step = SchedulerOutput()
        capacity = cache_config.num_usable_blocks * cache_config.block_size
        if capacity < config.max_model_len:
            logger.warning(
                "the KV cache holds %d tokens, fewer than max_model_len %d: longer requests "
                "will be rejected",
                capacity,
                config.max_model_len,
            )

    # -- requests in and out -------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request. Raises ValueError (nothing queued) when it can
        never run: a duplicate id, a prompt leaving no room to generate within
        max_model_len, or a sequence the whole KV pool cannot hold.
        Generation is capped at max_model_len (finish_reason "length")."""
        req_id, max_len = request.request_id, self.config.max_model_len
        if req_id in self.requests:
            raise ValueError(f"request id {req_id!r} is already in use")
        if request.num_prompt_tokens > max_len - 1:
            raise ValueError(
                f"request {req_id}: the prompt has {request.num_prompt_tokens} tokens but "
                f"max_model_len is {max_len}, which leaves no room to generate; shorten the "
                f"prompt to at most {max_len - 1} tokens or raise --max-model-len"
            )
        if request.max_tokens is None:
            # "as many as fit": within max_model_len and what the KV pool holds for one sequence
            # (the last token's KV is never computed, hence + 1)
            pool = self.kv_cache_manager.num_usable_blocks * self.block_size + 1
            if pool < max_len and request.num_prompt_tokens < pool:
                request.max_tokens = pool - request.num_prompt_tokens
        final_len = min(request.num_prompt_tokens + (request.max_tokens or max_len), max_len)
        # the last token's KV is never computed: the request stops on sampling it
        num_blocks = self.kv_cache_manager.num_blocks_for(final_len - 1)
        usable = self.kv_cache_manager.num_usable_blocks
        if num_blocks > usable:
            raise ValueError(
                f"request {req_id}: {request.num_prompt_tokens} prompt tokens + up to "
                f"{final_len - request.num_prompt_tokens} generated need {num_blocks} KV blocks of "
                f"{self.block_size} tokens, but the KV cache has only {usable}; lower max_tokens "
                "or give the KV cache more memory (--gpu-memory-utilization, --num-gpu-blocks-override)"
            )
        request.status = RequestStatus.WAITING
        self.requests[req_id] = request
        self.waiting.append(request)

    def finish_requests(
        self,
        request_ids: str | Iterable[str],
        status: RequestStatus,
        stop_reason: int | str | None = None,
    ) -> list[Request]:
        """Finish requests whose end the engine detected (a stop string, a client
        abort), running or waiting; their blocks are freed at once. Unknown or
        already finished ids are ignored. Returns the requests finished."""
        if not status.is_finished:
            raise ValueError(f"finish_requests needs a finished status, got {status.name}")
        ids = [request_ids] if isinstance(request_ids, str) else request_ids
        finished = []
        for req_id in ids:
            req = self.requests.get(req_id)
            if req is None:
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            elif req_id in self._held:  # its prompt's KV is being computed elsewhere
                self._held.discard(req_id)
            else:
                self.waiting.remove(req)
            req.status = status
            req.stop_reason = stop_reason
            self._free_finished(req)
            finished.append(req)
        return finished

    def set_draft_token_ids(self, request_id: str, draft_token_ids: Sequence[int]) -> None:
        """Drafts to verify at the request's next decode step (speculative
        decoding). Called by the engine core after ``update_from_output``;
        used once, by the next ``schedule``, and only if the request is then
        decoding (a preempted or finished request's drafts are dropped)."""
        if draft_token_ids and request_id in self.requests:
            self._draft_token_ids[request_id] = list(draft_token_ids)
        else:
            self._draft_token_ids.pop(request_id, None)

    def abort(self, request_id: str) -> Request | None:
        """Abort a request (running or waiting); its blocks are freed at once."""
        finished = self.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
        return finished[0] if finished else None

    # -- prefilled elsewhere (prefill/decode disaggregation, fd_core.disagg) ----

    def is_held(self, request_id: str) -> bool:
        """Whether ``request_id`` waits for its prompt's KV from elsewhere (``hold_request``)."""
        return request_id in self._held

    def hold_request(self, request_id: str) -> Request:
        """Take a just-added waiting request out of the queue while its prompt's KV
        is computed by another instance; it stays unfinished (``finish_requests``
        ends it; its blocks, allocated by the caller, are freed then).
        ``admit_prefilled`` puts it into running. Called by fd_core.disagg.decode."""
        req = self.requests[request_id]
        self.waiting.remove(req)
        self._held.add(request_id)
        return req

    def admit_prefilled(self, request_id: str, num_computed_tokens: int,
                        token_ids: Sequence[int]) -> RequestUpdate:
        """Run a held request whose blocks the caller allocated and filled
        (``kv_cache_manager.allocate_slots``): ``num_computed_tokens`` of its KV
        are in them, ``token_ids`` were sampled elsewhere (its first token).
        Full blocks are registered in the prefix cache; a stop among the tokens
        finishes (and frees) it here. Called by fd_core.disagg.decode."""
        self._held.remove(request_id)
        req = self.requests[request_id]
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_computed_tokens
        self.kv_cache_manager.cache_blocks(req, num_computed_tokens)
        new_token_ids = self._append_tokens(req, token_ids)
        if req.is_finished:
            self._free_finished(req)
        else:
            self.running.append(req)
        return RequestUpdate(req, new_token_ids, req.is_finished)

    @property
    def last_output(self) -> SchedulerOutput:
        """The last ``schedule()``'s output: a finished prefill's block table is
        there, its blocks unchanged until the next step (fd_core.disagg.prefill)."""
        return self._last_step

    # -- the step ------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Choose this step's work. Called by the engine core once per step."""
        kv = self.kv_cache_manager
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        partials = PartialPrefills(self.config)
        drafts_of, self._draft_token_ids = self._draft_token_ids, {}
        num_steps = self._num_steps(drafts_of)

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if num_steps > 1:  # every running request decodes num_steps tokens; _num_steps counted the blocks
                if kv.allocate_slots(req, num_steps) is None:
                    raise RuntimeError(f"request {req.request_id}: no free blocks for {num_steps} steps")
                scheduled.append(self._scheduled(req, 1, num_steps=num_steps))
                budget -= num_steps
                i += 1
                continue
            drafts = self._usable_drafts(req, drafts_of.get(req.request_id), budget)
            num_new = 1 + len(drafts) if drafts else self._num_new_tokens(req, req.num_computed_tokens, budget)
            if num_new == 0:
                i += 1
                continue
            while kv.allocate_slots(req, num_new) is None:
                if drafts:  # short of blocks: decode without drafts before preempting anyone
                    drafts, num_new = [], 1
                    continue
                # the most recently admitted; never one already scheduled this step
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:  # it preempted itself: nothing to take from
                break
            scheduled.append(self._scheduled(req, num_new, drafts))
            partials.count(req, req.num_computed_tokens, num_new)
            budget -= num_new
            i += 1

        w = 0
        while (
            not preempted
            and w < len(self.waiting)
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            req = self.waiting[w]
            hits, num_hit_tokens = kv.get_computed_blocks(req)
            num_new = self._num_new_tokens(req, num_hit_tokens, budget)
            if num_new == 0:
                break  # FCFS: nobody overtakes the head of the queue...
            verdict = partials.admit(req, num_hit_tokens, num_new)
            if verdict == "skip":  # ...except a short prompt behind a long one with no long slot left
                w += 1
                continue
            if verdict == "stop" or kv.allocate_slots(req, num_new, hits) is None:
                break
            partials.count(req, num_hit_tokens, num_new)
            del self.waiting[w]
            if req.status == RequestStatus.WAITING:  # first admission
                req.num_cached_tokens = num_hit_tokens
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_hit_tokens
            self.running.append(req)
            scheduled.append(self._scheduled(req, num_new))
            budget -= num_new

        decodes = [s for s in scheduled if s.num_tokens == 1]
        verifies = [s for s in scheduled if s.num_draft_tokens]
        prefills = [s for s in scheduled if s.num_tokens != 1 and not s.num_draft_tokens]
        swap_out, swap_in = kv.take_swap_ops()
        output = SchedulerOutput(
            scheduled=decodes + verifies + prefills,
            num_decodes=len(decodes),
            num_scheduled_tokens={s.request_id: s.num_tokens * s.num_steps for s in scheduled},
            total_num_scheduled_tokens=self.config.max_num_batched_tokens - budget,
            preempted_req_ids=preempted,
            finished_req_ids=self._finished_ids,
            swap_out=swap_out,
            swap_in=swap_in,
        )
        self._finished_ids = []
        self._last_step = output
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "step: %d decodes, %d prefills, %d tokens, %d preempted, %d running, %d waiting, kv %.1f%%",
                len(decodes),
                len(prefills),
                output.total_num_scheduled_tokens,
                len(preempted),
                len(self.running),
                len(self.waiting),
                100 * kv.usage,
            )
        return output

    def update_from_output(
        self, output: SchedulerOutput, sampled: Mapping[str, Sequence[int]]
    ) -> list[RequestUpdate]:
        """Apply a finished step: advance computed tokens, cache newly full
        blocks, append ``sampled[request_id]`` (for each request that sampled)
        up to the first stop, and free finished requests. Requests aborted
        since ``schedule`` are skipped. Called by the engine core after the
        forward and the sampler; stop strings are its own business
        (``finish_requests``)."""
        kv = self.kv_cache_manager
        updates = []
        for s in output.scheduled:
            req = self.requests.get(s.request_id)
            if req is None or req.status != RequestStatus.RUNNING:
                continue
            if req.num_computed_tokens != s.num_computed_tokens:
                raise RuntimeError(
                    f"request {s.request_id}: output of a stale step (computed "
                    f"{req.num_computed_tokens} tokens, the step started at {s.num_computed_tokens})"
                )
            if not s.samples:
                req.num_computed_tokens += s.num_tokens
                kv.cache_blocks(req, req.num_computed_tokens)
                continue
            token_ids = sampled.get(s.request_id)
            if not token_ids:
                raise ValueError(f"request {s.request_id} sampled this step but got no token ids")
            num_computed = s.num_tokens
            if s.num_steps > 1:  # multi-step: every token fed to a step (the last known, then the sampled
                # ones but the last) has its KV in the cache
                if len(token_ids) != s.num_steps:
                    raise ValueError(f"request {s.request_id}: {len(token_ids)} tokens for a schedule of "
                                     f"{s.num_steps} steps (one a step)")
                num_computed = s.num_steps
            if s.num_draft_tokens:  # verified drafts, then the target's own token
                num_rejected = s.num_draft_tokens - (len(token_ids) - 1)
                if num_rejected < 0:
                    raise ValueError(f"request {s.request_id}: {len(token_ids)} tokens for a step with "
                                     f"{s.num_draft_tokens} drafts (at most drafts + 1)")
                num_computed -= num_rejected  # the KV of rejected drafts: the next step overwrites it
            req.num_computed_tokens += num_computed
            new_token_ids = self._append_tokens(req, token_ids)
            # a stop among accepted drafts: the tokens after it were never emitted
            req.num_computed_tokens = min(req.num_computed_tokens, req.num_tokens)
            kv.cache_blocks(req, req.num_computed_tokens)  # verified tokens only
            if s.num_draft_tokens and not req.is_finished:
                kv.trim(req, req.num_computed_tokens)  # blocks that held only rejected drafts
            if req.is_finished:
                self.running.remove(req)
                self._free_finished(req)
            updates.append(RequestUpdate(req, new_token_ids, req.is_finished))
        return updates

    # -- state for the engine and metrics -------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def reset_prefix_cache(self) -> bool:
        """Forget cached prefixes; False (nothing done) while requests hold blocks."""
        return self.kv_cache_manager.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats:
        kv, step = self.kv_cache_manager, self._last_step
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_stats.queries,
            prefix_cache_hits=kv.prefix_cache_stats.hits,
            prefix_cache_host_hits=kv.prefix_cache_stats.host_hits,
            num_preemptions=self.num_preemptions,
            num_preempted=sum(r.status == RequestStatus.PREEMPTED for r in self.waiting),
            num_free_blocks=kv.pool.num_free_blocks,
            num_free_uncached_blocks=kv.pool.num_free_uncached_blocks,
            num_cached_blocks=kv.pool.num_cached_blocks,
            num_swap_outs=kv.pool.num_swap_outs,
            num_swap_ins=kv.pool.num_swap_ins,
            step_num_scheduled_tokens=step.total_num_scheduled_tokens,
            step_num_prefill_tokens=sum(s.num_tokens for s in step.scheduled[step.num_decodes :]),
            step_num_decodes=step.num_decodes,
        )

    # -- helpers -------------------------------------------------------------

    def _num_new_tokens(self, req: Request, num_computed: int, budget: int) -> int:
        """Tokens to compute for ``req`` this step given ``num_computed`` cached:
        all it lacks; with chunked prefill cut to the prefill threshold and the
        budget, without it 0 (wait) when that does not fit the budget."""
        num_new = req.num_tokens - num_computed
        if not self.config.enable_chunked_prefill:
            return num_new if num_new <= budget else 0
        threshold = self.config.long_prefill_token_threshold
        if threshold:
            num_new = min(num_new, threshold)
        return min(num_new, budget)

    def _num_steps(self, drafts_of: Mapping[str, list[int]]) -> int:
        """Forward steps for this schedule's decodes (multi-step decoding), 1 for a usual step: more only
        when every running request decodes and may (and has its ``min_tokens`` outputs where that bans
        something: before them the sampler bans its stop tokens each step), nobody waiting could be admitted,
        and the free blocks hold every step's slot; cut so no request passes its max_tokens or max_model_len."""
        steps = self.config.num_scheduler_steps
        running = self.running
        if steps <= 1 or not running or drafts_of or (self.waiting and len(running) < self.config.max_num_seqs):
            return 1
        steps = min(steps, self.config.max_num_batched_tokens // len(running))
        for req in running:
            if (not req.multi_step or req.num_computed_tokens != req.num_tokens - 1
                    or (req.num_output_tokens < req.min_tokens and req.min_tokens_bans)):
                return 1
            steps = min(steps, self.config.max_model_len - req.num_tokens)
            if req.max_tokens is not None:
                steps = min(steps, req.max_tokens - req.num_output_tokens)
            if steps <= 1:
                return 1
        kv = self.kv_cache_manager
        need = sum(max(kv.num_blocks_for(req.num_computed_tokens + steps) - len(kv.get_block_ids(req)), 0)
                   for req in running)
        return steps if need <= kv.pool.num_free_blocks else 1

    def _usable_drafts(self, req: Request, drafts: list[int] | None, budget: int) -> list[int]:
        """The part of ``drafts`` this step can verify: none unless ``req`` is
        decoding (one token left to compute); cut to the budget (the last token
        comes first) and so the step's KV stays within max_model_len."""
        if not drafts or req.num_computed_tokens != req.num_tokens - 1:
            return []
        room = min(budget - 1, self.config.max_model_len - req.num_tokens)
        return drafts[: max(room, 0)]

    def _scheduled(self, req: Request, num_new: int, drafts: Sequence[int] = (), num_steps: int = 1) -> ScheduledRequest:
        start = req.num_computed_tokens
        num_known = num_new - len(drafts)
        return ScheduledRequest(
            request_id=req.request_id,
            token_ids=req.all_token_ids[start : start + num_known] + list(drafts),
            num_computed_tokens=start,
            block_ids=self.kv_cache_manager.get_block_ids(req),
            samples=start + num_known == req.num_tokens,
            num_draft_tokens=len(drafts),
            num_steps=num_steps,
        )

    def _preempt(self, req: Request) -> None:
        self._draft_token_ids.pop(req.request_id, None)
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        logger.debug("preempted %s after %d outputs", req.request_id, req.num_output_tokens)

    def _append_tokens(self, req: Request, token_ids: Sequence[int]) -> list[int]:
        """Append ``token_ids`` to ``req`` one by one, up to and including one that stops it;
        returns those appended (the tokens after a stop are never emitted)."""
        appended = []
        for token_id in token_ids:
            req.append_output_token_id(token_id)
            appended.append(token_id)
            if self._check_stop(req):
                break
        return appended

    def _check_stop(self, req: Request) -> bool:
        """Set a final status if the last output token ends the request. EOS
        and stop tokens count only from min_tokens outputs on, and win over
        the length limits when both apply."""
        token_id = req.output_token_ids[-1]
        if req.num_output_tokens >= req.min_tokens:
            if token_id in req.eos_token_ids and not req.ignore_eos:
                req.status = RequestStatus.FINISHED_STOPPED
                return True
            if token_id in req.stop_token_ids:
                req.status = RequestStatus.FINISHED_STOPPED
                req.stop_reason = token_id
                return True
        max_tokens = req.max_tokens
        if (max_tokens is not None and req.num_output_tokens >= max_tokens) or (
            req.num_tokens >= self.config.max_model_len
        ):
            req.status = RequestStatus.FINISHED_LENGTH
            return True
        return False

    def _free_finished(self, req: Request) -> None:
        self._draft_token_ids.pop(req.request_id, None)
        req.finish_time = time.time()
        self.kv_cache_manager.free(req)
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)

