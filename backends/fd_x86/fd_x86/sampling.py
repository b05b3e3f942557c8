"""The sampler's draw on x86: ``fd_sample`` natively (``csrc/x86_sample_op.cc``).

Called by ``fd_x86.backend.fd_sample`` (the hook ``Sampler`` reaches through ``Ops.sample``) once per step
with the step's processed logits. The distribution and the draw are the reference's "sort" method
(``fd_core.ops.sampling``): temperature, min-p, top-k, top-p, the inverse CDF at ``uniforms[:, 0]``, in
float64; greedy rows take numpy's argmax. Where the reference sorts the row in numpy (0.4-12 ms for a
103424-wide row, more the flatter the logits), the op sorts only the buckets of weights the draw looks at
(0.1-0.3 ms). A token can differ from the reference's only where the uniform lies within rounding of a CDF
step (the sums run in another order); the same logits always draw the same token here, in one step or in
``fd_x86_run_plan_steps``' multi-step run, which calls the same code.

Returns None (the reference answers) for the "rejection" method, for logits that are not a 2-D fp32 host
tensor, and with ``FD_X86_SAMPLE=0`` (read per call: A/B comparisons).
"""

from __future__ import annotations

import os
from typing import Any

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops

__all__ = ["enabled", "op_args", "sample"]


def enabled(method: str) -> bool:
    """Whether the native draw takes ``method`` (and ``FD_X86_SAMPLE`` does not turn it off)."""
    return method == "sort" and os.environ.get("FD_X86_SAMPLE", "1") != "0"


def sample(logits: Any, temperature: Any, top_k: Any, top_p: Any, min_p: Any, uniforms: Any, method: str) -> Any:
    """Token ids ``[B]`` int64, or None where the native op does not take these arguments."""
    import paddle

    if not enabled(method) or not isinstance(logits, paddle.Tensor) or logits.dtype != paddle.float32 \
            or len(logits.shape) != 2 or not logits.place.is_cpu_place():
        return None
    if not all(x.place.is_cpu_place() for x in (temperature, top_k, top_p, min_p, uniforms)):
        return None
    return load_ops().fd_x86_sample(*op_args((logits, temperature, top_k, top_p, min_p, uniforms),
                                             ("float32", "float32", "int64", "float32", "float32", "float32")),
                                    num_threads())


def op_args(tensors: Any, dtypes: Any) -> list[Any]:
    """``tensors`` as the native ops take them: contiguous, of ``dtypes`` (cast or copied only where needed:
    the sampler's own arguments already are)."""
    out = []
    for x, dtype in zip(tensors, dtypes, strict=True):
        if str(x.dtype) != f"paddle.{dtype}":
            x = x.astype(dtype)
        out.append(x if x.is_contiguous() else x.contiguous())
    return out
