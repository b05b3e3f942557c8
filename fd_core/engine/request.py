"""A request as the scheduler tracks it: tokens, progress, status, timings.

Pure Python. Sampling parameters are duck-typed (``SamplingLike``): the
scheduler reads only the fields that decide when a sequence stops; the
sampler reads the rest from ``request.sampling_params``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fd_core.sampling.params import SamplingParams

__all__ = ["EngineCoreRequest", "Request", "RequestStatus", "SamplingLike"]


@dataclass
class EngineCoreRequest:
    """A tokenized request as the engine core receives it (built by the
    frontend in the API process, which must not import the engine core)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: list[int] = field(default_factory=list)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    arrival_time: float | None = None
    cache_salt: str | None = None
    mm_inputs: Any = None  # fd_core.multimodal.MultiModalInputs of a prompt with images
    # --splitwise-role decode: the prefill instance ("host:port") to use, as the router chose it
    # (HTTP header x-fd-prefill-addr); None: the decode instance chooses (fd_core.disagg.decode)
    prefill_addr: str | None = None


class SamplingLike(Protocol):
    """What the scheduler reads from ``fd_core.sampling.params.SamplingParams``
    (read-only properties, so a dataclass with ``list[int]`` fields matches)."""

    @property
    def max_tokens(self) -> int | None: ...  # None: up to max_model_len

    @property
    def min_tokens(self) -> int: ...  # EOS and stop_token_ids count only from this many outputs

    @property
    def ignore_eos(self) -> bool: ...

    @property
    def stop_token_ids(self) -> Sequence[int] | None: ...


class RequestStatus(enum.IntEnum):
    """Lifecycle; every status after PREEMPTED is final."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()  # back in the waiting queue, to be recomputed
    FINISHED_STOPPED = enum.auto()  # EOS or a stop token / stop string
    FINISHED_LENGTH = enum.auto()  # max_tokens or max_model_len reached
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI ``finish_reason`` of a final status, else None."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """One sequence. The scheduler owns ``status``, ``num_computed_tokens``
    and the outputs; the KV cache manager owns ``block_hashes``.

    A request with ``n > 1`` is fanned out by the engine into ``n`` requests;
    their prompts share KV blocks through the prefix cache.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingLike | None = None,
        eos_token_ids: Sequence[int] = (),
        *,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        mm_hashes: Sequence[str] = (),
        mm_positions: Sequence[tuple[int, int]] = (),
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: the prompt is empty; send at least one token")
        if len(mm_hashes) != len(mm_positions):
            raise ValueError(
                f"request {request_id}: {len(mm_hashes)} mm_hashes but {len(mm_positions)} "
                "mm_positions; give one (offset, length) per multimodal item"
            )
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = frozenset(eos_token_ids)  # from the model's generation config
        sp = sampling_params
        self.max_tokens: int | None = sp.max_tokens if sp is not None else None
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(
                f"request {request_id}: max_tokens must be >= 1, got {self.max_tokens}"
            )
        self.min_tokens: int = sp.min_tokens if sp is not None else 0
        self.ignore_eos: bool = sp.ignore_eos if sp is not None else False
        self.stop_token_ids = frozenset(sp.stop_token_ids or ()) if sp is not None else frozenset()
        # min_tokens bans something before that many outputs (the sampler's rule: stop_token_ids, and the
        # EOS ids unless ignore_eos): such a request decodes one step a schedule until then
        self.min_tokens_bans: bool = bool(self.stop_token_ids) or (not self.ignore_eos and bool(self.eos_token_ids))
        # prompt logprobs need the logits of every prompt position: a prefix-cache hit
        # would skip computing them (the request's own blocks are still cached for others)
        self.skip_prefix_cache: bool = sp is not None and getattr(sp, "prompt_logprobs", None) is not None

        # prefix-cache keys besides the tokens: the salt goes into block 0's
        # hash; an image's hash goes into every block its placeholder overlaps
        self.cache_salt = cache_salt
        self.mm_hashes = list(mm_hashes)
        self.mm_positions = [
            (int(o), int(n)) for o, n in mm_positions
        ]  # (offset, length) in tokens
        self.block_hashes: list[int] = []  # hash of each full block of all_token_ids, in order

        self.output_token_ids: list[int] = []
        self._all_token_ids = list(self.prompt_token_ids)  # prompt + outputs, appended in place
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None  # the stop token id or stop string, if any
        self.num_cached_tokens = 0  # prefix-cache hit at first admission (usage.cached_tokens)
        self.num_preemptions = 0
        # set by the engine core: its decode steps may run several forward steps in one schedule
        # (--num-scheduler-steps; a request whose draw nothing but the logits changes, see EngineCore)
        self.multi_step = False

        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    # -- token views ---------------------------------------------------------

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then outputs. The scheduler's own list: do not mutate."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_id(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.time()
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    # -- status --------------------------------------------------------------

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        """ "stop", "length", "abort", or None while unfinished."""
        return self.status.finish_reason

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
            f"outputs={self.num_output_tokens}, computed={self.num_computed_tokens})"
        )
