"""Sampling: request parameters, the sampler, logits processors and logprobs.

Owns ``SamplingParams`` (``params``: validated user input, pure Python, safe
to import in the API process), the per-request ``SamplingState`` and the
``Sampler`` that turns a step's logits into tokens (``sampler``), the logits
processors (``penalties``: logit_bias, bad words, min_tokens, repetition /
presence / frequency penalties, compiled once per request; ``bad_words``:
the bad-words matcher; ``logits_processors``: the pluggable
``--logits-processors`` switched on by ``logits_processors_args``), the
thinking budget (``reasoning_budget``), the repetition early stop
(``early_stop``) and logprobs (``logprobs``). The sampling
kernels themselves (temperature, min-p, top-k, top-p, the draw) are backend
ops (``fd_core.ops.sampling``), reached through ``Ops.sample``.

May import: fd_core.envs, fd_core._paddle, fd_core.ops (host helpers),
numpy, and the backend ``Ops`` it is given. Importing this package imports neither paddle nor numpy; the
paddle-using names below load on first access.
"""

from __future__ import annotations

from typing import Any

from fd_core.sampling.params import SamplingParams

__all__ = [
    "Logprobs",
    "Sampler",
    "SamplerOutput",
    "SamplingParams",
    "SamplingState",
    "compute_prompt_logprobs",
]

_LAZY = {
    "Sampler": "fd_core.sampling.sampler",
    "SamplerOutput": "fd_core.sampling.sampler",
    "SamplingState": "fd_core.sampling.sampler",
    "Logprobs": "fd_core.sampling.logprobs",
    "compute_prompt_logprobs": "fd_core.sampling.logprobs",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fd_core.sampling' has no attribute {name!r}")
