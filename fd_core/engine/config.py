"""Configs of the KV cache manager and the scheduler: one small frozen
dataclass each, built at the CLI/API boundary and handed only to the
component that uses it. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheConfig", "SchedulerConfig"]


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache as the block manager sees it: counts, no bytes."""

    num_blocks: int  # device blocks in the pool, block 0 included (reserved null block)
    block_size: int = 64  # tokens per block
    num_host_blocks: int = 0  # host (swap) tier blocks, from --swap-space; 0 = no host tier
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_blocks < 2:
            raise ValueError(
                f"num_blocks must be >= 2 (block 0 is the reserved null block), got {self.num_blocks}; "
                "raise --gpu-memory-utilization or --num-gpu-blocks-override"
            )
        if self.num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {self.num_host_blocks}")

    @property
    def num_usable_blocks(self) -> int:
        """Blocks requests can hold: all but the null block."""
        return self.num_blocks - 1


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one scheduling step and of one sequence."""

    max_num_seqs: int  # running requests at most (--max-num-seqs)
    max_num_batched_tokens: int  # new tokens per step at most (--max-num-batched-tokens)
    max_model_len: int  # prompt + generated tokens of one request at most (--max-model-len)
    enable_chunked_prefill: bool = True  # cut a prefill to the step's remaining budget
    # with chunked prefill, no prefill chunk is longer than this (0 = no limit),
    # so one long prompt does not take a whole step from the others
    long_prefill_token_threshold: int = 0
    # partial prefills: requests whose prefill chunk this step does not reach the end
    # of their prompt. At most max_num_partial_prefills of them per step, and at most
    # max_long_partial_prefills of those "long" (more than long_prompt_threshold tokens
    # left): a long prompt that finds no long slot waits and shorter ones behind it go
    # first, so short requests are not stuck behind long ones (vLLM / FastDeploy)
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    # multi-step decoding: a schedule whose requests all decode (and may: Request.multi_step) runs up
    # to this many forward steps, each request's token fed to the next (vLLM's --num-scheduler-steps)
    num_scheduler_steps: int = 1

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len < 2:
            raise ValueError(
                f"max_model_len must be >= 2 (a prompt token and a generated one), got {self.max_model_len}"
            )
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}"
            )
        for name in ("max_num_partial_prefills", "max_long_partial_prefills", "num_scheduler_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError(
                f"--max-long-partial-prefills {self.max_long_partial_prefills} exceeds "
                f"--max-num-partial-prefills {self.max_num_partial_prefills}; it counts a subset of them"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"--max-num-batched-tokens {self.max_num_batched_tokens} is smaller than "
                f"--max-model-len {self.max_model_len} with chunked prefill disabled: a prompt of "
                "up to max_model_len tokens must fit in one step. Raise --max-num-batched-tokens "
                "to at least max_model_len, or pass --enable-chunked-prefill."
            )

    @property
    def long_prompt_threshold(self) -> int:
        """Tokens left to prefill above which a prefill is "long": the explicit
        threshold, else 4% of max_model_len when partial prefills are limited above 1
        (vLLM's default), else 0 (no prefill is long)."""
        if self.long_prefill_token_threshold:
            return self.long_prefill_token_threshold
        if self.max_num_partial_prefills > 1:
            return max(1, int(self.max_model_len * 0.04))
        return 0
