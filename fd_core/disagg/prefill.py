"""The prefill role: run decode instances' prompts and ship their KV.

``PrefillEngine`` wraps the instance's ``EngineCore`` (the instance still
serves its own HTTP clients as a mixed one would). A task from a decode
instance arrives on the transport's thread and waits in ``inbox``; the
engine's thread (``step``) adds it to the core with ``max_tokens=1`` (its
prompt through the prefix cache, its first token sampled with the request's
own parameters), and right after the step that sampled it reads the blocks
from that step's block table (``Scheduler.last_output``: the request's blocks
were freed by the step but nothing overwrites them before the next one) and
replies with the first token and the blocks the decode side did not hold.

Called by the engine loop (``fd_core.engine.engine_process``) or by a test's
thread, as an EngineCore: ``step``, ``has_unfinished_requests``, ``add_request``...
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import time
import weakref
from dataclasses import dataclass
from typing import Any

from fd_core.disagg.config import DisaggConfig
from fd_core.disagg.kv_io import export_blocks, fingerprint_of, parts_per_pool
from fd_core.disagg.transport import KVTransport, Reply, release, transport_for
from fd_core.disagg.wire import (
    PrefillReply,
    PrefillTask,
    TransferError,
    check_fingerprint,
    dumps,
    loads,
)
from fd_core.engine.request import EngineCoreRequest

__all__ = ["PrefillEngine"]

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    task: PrefillTask
    reply: Reply
    received: float
    request: Any  # the core's Request (its block hashes outlive it)


class PrefillEngine:
    """An EngineCore that also serves decode instances' prefill tasks."""

    def __init__(self, core: Any, config: DisaggConfig, transport: KVTransport | None = None) -> None:
        self.core = core
        self.config = config
        self.fingerprint = fingerprint_of(core)
        self.transport = transport or transport_for(config.protocols, core.backend.pm)
        self._inbox: queue.SimpleQueue[tuple[list[bytes], Reply, float]] = queue.SimpleQueue()
        self._jobs: dict[str, _Job] = {}  # core request id -> its task
        self._ids = itertools.count()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # the listening socket and the pipe go when close() is called or the engine is dropped
        self._release = weakref.finalize(self, release, None, self.transport, (self._wake_r, self._wake_w))
        self.num_tasks = 0
        self.kv_bytes_sent = 0
        for address in config.listen:
            self.transport.listen(address, self._on_task)
        logger.info("prefill instance: serving KV-transfer tasks on %s (%s)", ", ".join(config.listen),
                    self.transport.name)

    def __getattr__(self, name: str) -> Any:  # the rest of EngineCore's surface
        return getattr(self.core, name)

    @property
    def wakeup_fd(self) -> int:
        """Readable when a task arrived: the engine loop polls it beside its socket."""
        return self._wake_r

    def _on_task(self, frames: list[bytes], reply: Reply) -> None:  # the transport's thread
        self._inbox.put((frames, reply, time.perf_counter()))
        os.write(self._wake_w, b"t")

    def has_unfinished_requests(self) -> bool:
        return bool(self.core.has_unfinished_requests() or not self._inbox.empty() or self._jobs)

    def add_request(self, req: EngineCoreRequest) -> None:
        self.core.add_request(req)

    def abort(self, request_ids: list[str], *args: Any, **kwargs: Any) -> None:
        self.core.abort(request_ids, *args, **kwargs)

    def close(self) -> None:
        """Stop listening and free the pipe (the engine loop calls it at shutdown)."""
        self._release()

    # -------------------------------------------------------------- the step

    def step(self) -> list[Any]:
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
        while not self._inbox.empty():
            self._start(*self._inbox.get())
        if not self.core.has_unfinished_requests():
            return []
        outputs = self.core.step()
        mine = [o for o in outputs if o.request_id in self._jobs]
        if not mine:
            return outputs  # type: ignore[no-any-return]
        tables = {s.request_id: s.block_ids for s in self.core.scheduler.last_output.scheduled}
        for out in mine:
            self._finish(out, tables.get(out.request_id, []))
        ids = {o.request_id for o in mine}
        return [o for o in outputs if o.request_id not in ids]

    def _start(self, frames: list[bytes], reply: Reply, received: float) -> None:
        task: PrefillTask | None = None
        try:
            if len(frames) != 1:
                raise TransferError(f"a prefill task is one frame, got {len(frames)}")
            task = loads(frames[0], PrefillTask)
            check_fingerprint(self.fingerprint, task.fingerprint, "the decode instance")
            rid = f"pd:{task.request_id}:{next(self._ids)}"
            params = task.sampling_params
            params = params.replace(max_tokens=1, min_tokens=min(params.min_tokens, 1))
            self.core.add_request(EngineCoreRequest(
                rid, list(task.prompt_token_ids), params, list(task.eos_token_ids),
                bad_words_token_ids=list(task.bad_words_token_ids), cache_salt=task.cache_salt))
        except Exception as exc:  # noqa: BLE001 - a malformed task fails itself, never the engine
            request_id = getattr(task, "request_id", "?")
            reply([dumps(PrefillReply(str(request_id), error=f"prefill instance refused the task: "
                                                             f"{type(exc).__name__}: {exc}"))])
            return
        self.num_tasks += 1
        self._jobs[rid] = _Job(task, reply, received, self.core.scheduler.get_request(rid))

    def _finish(self, out: Any, table: list[int]) -> None:
        job = self._jobs.pop(out.request_id)
        task = job.task
        if not out.new_token_ids or out.finish_reason == "abort":
            job.reply([dumps(PrefillReply(task.request_id, error=f"prefill failed: {out.stop_reason}"))])
            return
        bs = self.fingerprint.block_size
        num_prompt = len(task.prompt_token_ids)
        first = len(task.held_block_hashes)
        own = list(job.request.block_hashes) if job.request is not None else []
        if first > (num_prompt - 1) // bs or (len(own) >= first and own[:first] != task.held_block_hashes[:first]):
            job.reply([dumps(PrefillReply(task.request_id, error=(
                f"the decode instance holds {first} blocks whose hashes do not match this prompt's here")))])
            return
        computed = time.perf_counter() - job.received
        blocks = table[first:-(-num_prompt // bs)]
        frames = export_blocks(self.core, blocks)
        nbytes = sum(len(f) for f in frames)
        self.kv_bytes_sent += nbytes
        header = PrefillReply(
            task.request_id, fingerprint=self.fingerprint, first_token_ids=list(out.new_token_ids),
            first_logprobs=out.new_logprobs, first_block=first, num_blocks=len(blocks),
            parts_per_pool=parts_per_pool(self.fingerprint.kv_dtype), num_cached_tokens=out.num_cached_tokens,
            prefill_seconds=computed)
        job.reply([dumps(header), *frames])
        logger.info("prefill %s: %d prompt tokens (%d cached here), sent %d blocks (%d bytes) from block %d",
                    task.request_id, num_prompt, out.num_cached_tokens, len(blocks), nbytes, first)
