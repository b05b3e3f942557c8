"""The decode role: prompts are prefilled by a prefill instance, then decoded here.

``DecodeEngine`` wraps the instance's ``EngineCore``. ``add_request`` adds a
request to the core as usual, then takes it out of the scheduler's queue
(``Scheduler.hold_request``) and reserves its blocks: the prompt's blocks
this pool already caches (by hash, pinned now) and new ones for the rest.
A worker thread sends the task (tokens, sampling parameters with the seed
fixed, the hashes of the cached blocks) to the least-busy prefill instance
and waits for the reply, at most ``timeout_s``. The engine's thread
(``step``) checks each reply (model fingerprint, block count, frame sizes),
writes the KV into the reserved blocks (``kv_io.import_blocks``), and runs
the request with its prompt computed and its first token appended
(``Scheduler.admit_prefilled``); the first token's output carries the bytes
received. A failed, refused, mismatched or timed-out transfer ends only its
request, as ``abort`` with the error as ``stop_reason``.

Requests the prefill side cannot do exactly (guided decoding, images, prompt
logprobs, a thinking budget) are prefilled here, as a mixed instance would.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import select
import time
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fd_core.disagg.config import DisaggConfig
from fd_core.disagg.kv_io import fingerprint_of, frame_sizes, import_blocks
from fd_core.disagg.transport import KVTransport, release, transport_for
from fd_core.disagg.wire import (
    PrefillReply,
    PrefillTask,
    TransferError,
    check_fingerprint,
    check_frames,
    dumps,
    loads,
)
from fd_core.engine.outputs import EngineCoreOutput
from fd_core.engine.request import EngineCoreRequest, RequestStatus

__all__ = ["DecodeEngine"]

logger = logging.getLogger(__name__)
IDLE_WAIT_S = 0.01  # nothing to run, transfers in flight: wait this long for one to land


@dataclass
class _Transfer:
    request_id: str
    task: PrefillTask
    block_ids: list[int]  # the request's whole table: held hits, then the blocks to fill
    request: Any = None  # the scheduler's Request it was reserved for (an id may be reused after an abort)
    peer: str = ""
    queued: float = field(default_factory=time.perf_counter)  # the timeout counts from here
    cancelled: bool = False  # aborted before a worker thread took it: not sent
    sent: float = 0.0
    reply: list[bytes] = field(default_factory=list)
    error: str | None = None


class DecodeEngine:
    """An EngineCore whose prompts are prefilled by prefill instances."""

    def __init__(self, core: Any, config: DisaggConfig, transport: KVTransport | None = None) -> None:
        self.core = core
        self.config = config
        self.fingerprint = fingerprint_of(core)
        self.transport = transport or transport_for(config.protocols, core.backend.pm)
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="fd-disagg-transfer")
        self._done: queue.SimpleQueue[_Transfer] = queue.SimpleQueue()
        self._ready: deque[_Transfer] = deque()  # replies waiting for a running slot
        self._no_blocks: deque[str] = deque()  # held requests waiting for free blocks
        self._tasks: dict[str, tuple[PrefillTask, str | None]] = {}  # request id -> its task, until sent
        self._sending: dict[str, _Transfer] = {}  # request id -> its transfer, submitted and not yet back
        self._in_flight: dict[str, int] = {addr: 0 for addr in config.prefill_addrs}
        self._turn = itertools.count()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # the transfer threads, the transport and the pipe go when close() is called or the engine is dropped
        self._release = weakref.finalize(self, release, self._pool, self.transport, (self._wake_r, self._wake_w))
        self.kv_bytes_received = 0
        self.num_transfers = 0
        self.num_failed = 0

    def __getattr__(self, name: str) -> Any:  # the rest of EngineCore's surface
        return getattr(self.core, name)

    @property
    def wakeup_fd(self) -> int:
        """Readable when a transfer ended: the engine loop polls it beside its socket."""
        return self._wake_r

    def close(self) -> None:
        """Stop the transfer threads, the transport and the pipe (the engine loop calls it at shutdown)."""
        self._release()

    # ------------------------------------------------------------ requests

    def add_request(self, req: EngineCoreRequest, prefill_addr: str | None = None) -> None:
        """Add ``req``; its prompt goes to ``prefill_addr`` (host:port, e.g. the
        router's ``x-fd-prefill-addr``, carried as ``req.prefill_addr``) or the least
        busy prefill instance."""
        prefill_addr = prefill_addr or req.prefill_addr
        self.core.add_request(req)  # validation, seed, sampling state: as a mixed instance
        p = req.sampling_params
        scheduler = self.core.scheduler
        if (scheduler.get_request(req.request_id) is None or req.mm_inputs is not None
                or p.prompt_logprobs is not None or p.reasoning_max_tokens is not None):
            return  # prefilled here
        request = scheduler.hold_request(req.request_id)
        params = self.core._states[req.request_id].params  # the seed the core fixed
        task = PrefillTask(
            req.request_id, list(req.prompt_token_ids), params, list(req.eos_token_ids), self.fingerprint,
            bad_words_token_ids=list(req.bad_words_token_ids), cache_salt=req.cache_salt)
        self._tasks[req.request_id] = (task, prefill_addr)
        if not self._reserve(request):
            self._no_blocks.append(req.request_id)

    def _reserve(self, request: Any) -> bool:
        """Pin the cached prefix, allocate the rest, send the task; False when blocks are short."""
        kv = self.core.scheduler.kv_cache_manager
        hits, num_hit = kv.get_computed_blocks(request)
        block_ids = kv.allocate_slots(request, request.num_prompt_tokens - num_hit, hits)
        if block_ids is None:
            return False
        request.num_cached_tokens = num_hit
        task, addr = self._tasks.pop(request.request_id)
        task.held_block_hashes = list(request.block_hashes[: len(hits)])
        transfer = _Transfer(request.request_id, task, block_ids, request, peer=addr or self._choose())
        self._in_flight[transfer.peer] = self._in_flight.get(transfer.peer, 0) + 1
        if addr and not self.config.allows(addr):  # its KV would enter the prefix cache: only trusted peers
            transfer.error = (f"x-fd-prefill-addr names {addr}, which is not one of this decode instance's "
                              f"prefill instances ({', '.join(self.config.prefill_addrs)}); "
                              "FD_PD_ALLOWED_PREFILL_ADDRS adds addresses ('*': any)")
            self._done.put(transfer)
            os.write(self._wake_w, b"d")
            return True
        self._sending[request.request_id] = transfer
        self._pool.submit(self._send, transfer)
        return True

    def _choose(self) -> str:
        """The prefill instance with the fewest transfers in flight (ties in turn)."""
        addrs = list(self.config.prefill_addrs)
        start = next(self._turn) % len(addrs)
        order = addrs[start:] + addrs[:start]
        return min(order, key=lambda a: self._in_flight.get(a, 0))

    def _send(self, transfer: _Transfer) -> None:  # a worker thread
        transfer.sent = time.perf_counter()
        left = self.config.timeout_s - (transfer.sent - transfer.queued)
        try:
            if transfer.cancelled:
                raise TransferError("aborted before it was sent")
            if left <= 0:
                raise TransferError(f"no KV transfer to {transfer.peer} could start within "
                                    f"FD_PD_TRANSFER_TIMEOUT ({self.config.timeout_s:g} s): too many in flight")
            transfer.reply = self.transport.request(transfer.peer, [dumps(transfer.task)], left)
        except TransferError as exc:
            transfer.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - any transport failure ends only this request
            transfer.error = f"KV transfer from {transfer.peer} failed: {type(exc).__name__}: {exc}"
        self._done.put(transfer)
        os.write(self._wake_w, b"d")

    def has_unfinished_requests(self) -> bool:
        # a landed transfer (even an aborted request's) must be taken off _done by step(),
        # which also drains the wake pipe the engine loop polls
        return bool(self.core.has_unfinished_requests() or self._ready or not self._done.empty())

    def abort(self, request_ids: list[str], *args: Any, **kwargs: Any) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            self._tasks.pop(rid, None)
            sending = self._sending.pop(rid, None)
            if sending is not None:
                sending.cancelled = True  # a worker thread that has not sent it yet will not
            if rid in self._no_blocks:
                self._no_blocks.remove(rid)
        self.core.abort(ids, *args, **kwargs)  # frees a held request's reserved blocks

    # -------------------------------------------------------------- the step

    def step(self) -> list[Any]:
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
        scheduler = self.core.scheduler
        while self._no_blocks:
            request = scheduler.get_request(self._no_blocks[0])
            if request is None:
                self._no_blocks.popleft()
            elif self._reserve(request):
                self._no_blocks.popleft()
            else:
                break
        while not self._done.empty():
            transfer = self._done.get()
            if self._sending.get(transfer.request_id) is transfer:
                del self._sending[transfer.request_id]
            self._in_flight[transfer.peer] -= 1
            self._ready.append(transfer)
        outputs: list[Any] = []
        if self._ready:
            # a reserved block may have evicted a cached one whose copy to the host tier (--swap-space)
            # is still due: copy now, as the next step would before its forward, before any KV lands
            swap_out, swap_in = scheduler.kv_cache_manager.take_swap_ops()
            if swap_out or swap_in:
                self.core.runner.apply_swaps(swap_out, swap_in)
        while self._ready and len(scheduler.running) < scheduler.config.max_num_seqs:
            output = self._admit(self._ready.popleft())
            if output is not None:
                outputs.append(output)
        if scheduler.running or scheduler.waiting or self.core.structured.has_held():
            outputs.extend(self.core.step())
        elif not outputs and scheduler.has_unfinished_requests():
            select.select([self._wake_r], [], [], IDLE_WAIT_S)  # only transfers in flight
        return outputs

    def _admit(self, transfer: _Transfer) -> EngineCoreOutput | None:
        rid = transfer.request_id
        scheduler = self.core.scheduler
        if scheduler.get_request(rid) is not transfer.request or not scheduler.is_held(rid):
            return None  # aborted meanwhile (its blocks went back then), perhaps resent under the same id
        try:
            reply, kv_frames = self._check(transfer)
            import_blocks(self.core, transfer.block_ids[reply.first_block:], kv_frames)
        except Exception as exc:  # noqa: BLE001 - a bad reply fails its request, never the engine
            self.num_failed += 1
            why = str(exc) if isinstance(exc, TransferError) else \
                f"KV transfer from {transfer.peer} failed: {type(exc).__name__}: {exc}"
            logger.warning("request %s: %s", rid, why)
            self.core.abort([rid])
            return EngineCoreOutput(rid, [], finish_reason="abort", stop_reason=why, error=why)
        nbytes = sum(len(f) for f in kv_frames)
        self.kv_bytes_received += nbytes
        self.num_transfers += 1
        state = self.core._states.get(rid)
        if state is not None and not state.params.greedy:
            state.draw_uniforms()  # the prefill side drew the first token's uniforms from the same seed
        update = scheduler.admit_prefilled(rid, len(transfer.task.prompt_token_ids), reply.first_token_ids)
        req = update.request
        if update.finished:
            self.core.abort([rid], RequestStatus.FINISHED_STOPPED)  # drops its state; already finished
        return EngineCoreOutput(
            request_id=rid, new_token_ids=update.new_token_ids,
            new_logprobs=reply.first_logprobs[: len(update.new_token_ids)] if reply.first_logprobs else None,
            finish_reason=req.finish_reason if update.finished else None,
            stop_reason=req.stop_reason if update.finished else None,
            num_cached_tokens=req.num_cached_tokens, events={"scheduled": time.time()},
            # the transfer's own cost: task sent -> KV written here, less the prefill side's queue and compute
            kv_transfer_bytes=nbytes,
            kv_transfer_seconds=max(0.0, time.perf_counter() - transfer.sent - reply.prefill_seconds),
        )

    def _check(self, transfer: _Transfer) -> tuple[PrefillReply, list[bytes]]:
        peer = f"prefill instance {transfer.peer}"
        if transfer.error is not None:
            raise TransferError(transfer.error)
        if not transfer.reply:
            raise TransferError(f"{peer} sent an empty reply")
        reply = loads(transfer.reply[0], PrefillReply)
        if reply.error is not None:
            raise TransferError(f"{peer}: {reply.error}")
        check_fingerprint(self.fingerprint, reply.fingerprint, peer)
        held = len(transfer.task.held_block_hashes)
        if reply.first_block != held or held + reply.num_blocks != len(transfer.block_ids):
            raise TransferError(f"{peer} sent blocks [{reply.first_block}, {reply.first_block + reply.num_blocks})"
                                f" of the prompt, expected [{held}, {len(transfer.block_ids)})")
        if not reply.first_token_ids:
            raise TransferError(f"{peer} sent no first token")
        kv_frames = transfer.reply[1:]
        check_frames(reply, kv_frames, frame_sizes(self.fingerprint, reply.num_blocks), peer)
        return reply, kv_frames
