"""What crosses between a decode and a prefill instance.

One exchange per request, as ZeroMQ multipart messages:

- task (decode -> prefill): one frame, a pickled ``PrefillTask``;
- reply (prefill -> decode): a pickled ``PrefillReply`` frame, then the KV
  frames: for each layer, K then V, each as the pool's parts (codes, then
  fp32 scales for an 8-bit KV dtype), of the blocks sent, in block order.

Frames are read back by an unpickler that builds only fd-core's sampling and
output classes and plain builtins, so a peer cannot make an instance run code.
The checks name the field and both values (``check_fingerprint``,
``check_frames``); a mismatch fails that request only.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from fd_core.safe_pickle import restricted_loads

__all__ = ["ModelFingerprint", "PrefillReply", "PrefillTask", "TransferError", "check_fingerprint",
           "check_frames", "dumps", "loads"]



class TransferError(RuntimeError):
    """A KV transfer failed; the message says what and where (it ends one request)."""


@dataclass(frozen=True)
class ModelFingerprint:
    """What must agree for one instance's KV blocks to mean the same in another's pool."""

    architecture: str
    num_layers: int
    num_kv_heads: int  # in the pool (one rank's)
    head_dim: int
    block_size: int
    kv_dtype: str  # --kv-cache-dtype resolved: float32, bfloat16, float16, int8, fp8
    vocab_size: int

    def block_bytes(self, itemsize: int, scale_bytes: int) -> int:
        """Bytes of one block of one layer's K (or V): codes plus scales."""
        rows = self.block_size * self.num_kv_heads
        return rows * self.head_dim * itemsize + rows * scale_bytes


@dataclass
class PrefillTask:
    """A decode instance asks for a prompt's KV (decode -> prefill)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: Any  # fd_core.sampling.params.SamplingParams, its seed already fixed
    eos_token_ids: list[int]
    fingerprint: ModelFingerprint
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    cache_salt: str | None = None
    held_block_hashes: list[int] = field(default_factory=list)  # leading blocks the decode side has


@dataclass
class PrefillReply:
    """The first token and the KV blocks the decode side lacks (prefill -> decode)."""

    request_id: str
    error: str | None = None  # set: the request fails with this message, nothing else is read
    fingerprint: ModelFingerprint | None = None
    first_token_ids: list[int] = field(default_factory=list)
    first_logprobs: Any = None  # list[PositionLogprobs] or None
    first_block: int = 0  # index in the prompt's blocks of the first block sent
    num_blocks: int = 0  # blocks sent
    parts_per_pool: int = 1  # frames per layer per K/V: 1 (float) or 2 (8-bit codes + scales)
    num_cached_tokens: int = 0  # the prefill side's own prefix-cache hit
    prefill_seconds: float = 0.0  # task received -> first token sampled (queue + compute), on the prefill side


def dumps(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes, expected: type) -> Any:
    """Read one header frame; TransferError when it is not a ``expected``."""
    try:
        value = restricted_loads(data, ("fd_core.disagg.wire", "fd_core.engine.outputs"), ("fd_core.sampling.",),
                                 "a KV-transfer peer")
    except Exception as exc:  # a forged or truncated frame fails the request, never the engine
        raise TransferError(f"unreadable KV-transfer message: {type(exc).__name__}: {exc}") from None
    if not isinstance(value, expected):
        raise TransferError(f"expected a {expected.__name__} from the KV-transfer peer, got {type(value).__name__}")
    return value


def check_fingerprint(ours: ModelFingerprint, theirs: ModelFingerprint | None, peer: str) -> None:
    """TransferError naming the first field that differs, with both values."""
    if theirs is None:
        raise TransferError(f"{peer} sent no model fingerprint")
    for name in ModelFingerprint.__dataclass_fields__:
        a, b = getattr(ours, name), getattr(theirs, name)
        if a != b:
            raise TransferError(f"KV transfer refused: {name} differs, {a!r} here but {b!r} on {peer}; "
                                "prefill and decode instances must serve the same model with the same "
                                "--block-size and --kv-cache-dtype")


def check_frames(reply: PrefillReply, frames: list[bytes], expected_sizes: list[int], peer: str) -> None:
    """TransferError unless ``frames`` are the reply's KV frames, each of its expected size."""
    if len(frames) != len(expected_sizes):
        raise TransferError(f"KV transfer from {peer}: {len(frames)} KV frames for {reply.num_blocks} blocks, "
                            f"expected {len(expected_sizes)} (layers x K/V x parts)")
    for i, (frame, size) in enumerate(zip(frames, expected_sizes)):
        if len(frame) != size:
            raise TransferError(f"KV transfer from {peer}: frame {i} has {len(frame)} bytes, expected {size} "
                                f"for {reply.num_blocks} blocks")
