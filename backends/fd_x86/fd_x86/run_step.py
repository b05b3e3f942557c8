"""What a decode step hands the fused run besides its layers (``fd_x86.layer``).

- ``step_ints``: the step's positions, slots, sequence lengths and block
  tables in one int64 tensor: the step's own ``decode_ints`` where
  ``fd_core.engine.step_tensors`` made one (no copy), else built once per step.
- ``embedding_fits``: whether the op reads a ``DecoderEmbedding``'s table in
  place (``FD_X86_FUSED_EMBEDDING=0`` gathers every table first).
- ``RunInputs`` / ``Plan``: a cached run's inputs and their native plan
  (``fd_x86_run_plan_new``): made at the run's first step, freed with the
  run's cache entry, so a step passes six tensors and the plan's id
  (``fd_x86_run_plan_step``) instead of ~80 tensors and five attribute lists
  (``FD_X86_RUN_PLAN=0`` passes them all each step).

A plan holds the run's tensors natively, among them weights whose memory
Python owns (``fd_x86.memory``'s huge-page mappings): every live plan is
freed at interpreter exit, before Python is finalized (``_free_all``), and a
plan dropped outside paddle's dynamic mode is freed at the next step.
"""

from __future__ import annotations

import atexit
import functools
import os
from typing import Any

import numpy as np

from fd_x86 import ops as x86_ops
from fd_x86.build import load_ops

__all__ = ["ORPHANS", "Plan", "RunInputs", "embedding_enabled", "embedding_fits", "free_orphans", "plans_enabled",
           "step_ints"]

STEP_KEY = "x86.layer"  # in metadata.workspace: the step's ints when built here
EMBED_DTYPES = ("paddle.float32", "paddle.bfloat16", "paddle.float16")  # the op's embedding tables


def step_ints(metadata: Any) -> Any:
    """The step's positions, slots, sequence lengths and block tables in one
    int64 tensor as the op takes them: the step's own ``decode_ints`` while
    its positions and slots are still the views ``step_tensors`` made of it
    (a copy of the metadata with other positions, ``dataclasses.replace``,
    does not pass), else built once per step and shared by the step's runs."""
    ints = metadata.decode_ints
    if ints is not None and _views_of(ints, metadata):
        return ints
    ints = metadata.workspace.get(STEP_KEY)
    if ints is None:
        rows = metadata.num_decodes
        host = np.concatenate([
            np.asarray(metadata.positions.numpy(), dtype=np.int64).reshape(-1),
            np.asarray(metadata.slot_mapping.numpy(), dtype=np.int64).reshape(-1),
            np.asarray(metadata.seq_lens[:rows], dtype=np.int64),
            np.asarray(metadata.block_tables[:rows], dtype=np.int64).reshape(-1),
        ])
        ints = metadata.workspace[STEP_KEY] = x86_ops._paddle().to_tensor(host)
    return ints


def _views_of(ints: Any, metadata: Any) -> bool:
    """``metadata.positions`` and ``slot_mapping`` are the first two rows of ``ints`` (host, contiguous)."""
    positions, slots = metadata.positions, metadata.slot_mapping
    start = ints.data_ptr()
    return (ints.place.is_cpu_place() and ints.is_contiguous() and positions.data_ptr() == start
            and slots.data_ptr() == start + 8 * int(positions.shape[0]))


def embedding_enabled() -> bool:
    """``FD_X86_FUSED_EMBEDDING=0``: the embedding before the run, as its own ops (A/B comparisons; read per call)."""
    return os.environ.get("FD_X86_FUSED_EMBEDDING", "1") != "0"


def embedding_fits(embedding: Any) -> bool:
    """The op reads the embedding in place: a contiguous host table of a 16-bit or fp32 dtype (a
    tied float head's transposed view is not: its rows are taken first) and int64 ids. The op
    checks the rest (the table's rank and width, the ids' rank and values) and refuses what does
    not fit."""
    table = embedding.table
    return (table.is_contiguous() and str(table.dtype) in EMBED_DTYPES and table.place.is_cpu_place()
            and str(embedding.ids.dtype) == "paddle.int64")


def plans_enabled() -> bool:
    """``FD_X86_RUN_PLAN=0``: every step passes the run's inputs to ``fd_x86_decoder_layers`` (A/B; per call)."""
    return os.environ.get("FD_X86_RUN_PLAN", "1") != "0"


class RunInputs(tuple):  # type: ignore[type-arg]
    """A run's ``fd_x86.layer.Run`` (the op's per-layer inputs) and the native plan made from them on first use."""

    plan: Plan | None = None


_LIVE: set[int] = set()  # the ids of the plans not yet freed
ORPHANS: list[int] = []  # plans dropped outside dynamic mode: freed at the next step (fd_x86.layer)
_EXITING: list[bool] = []  # non-empty once _free_all ran


class Plan:
    """A run's inputs held natively: a step passes its id. Freed with this object, which lives as
    long as the run's cache entry."""

    def __init__(self, run: Any, first: Any, head_args: tuple[int, int, int, float]) -> None:
        (norms, k_list, v_list, k_scales, v_scales, weights, methods, widths, groups, kinds, moe_tensors, moe_ints,
         moe_norm_min, head_tensors, _) = run
        free_orphans()
        some = norms[0]  # the op's unused slots take any tensor
        self.id = int(load_ops().fd_x86_run_plan_new(
            norms, k_list, v_list, k_scales, v_scales, weights, moe_tensors or [some],
            head_tensors[0] if head_tensors else some, head_tensors[1:] or [some, some], kinds, methods, widths,
            groups, float(first.eps), int(first.num_heads), int(first.num_kv_heads), bool(first.interleaved_rope),
            float(first.scale), moe_ints, moe_norm_min, *head_args,
        ).numpy()[0])
        _LIVE.add(self.id)

    def __del__(self) -> None:
        plan = getattr(self, "id", None)  # None: the op refused the run's inputs
        if _EXITING or plan not in _LIVE:  # freed at exit already
            return
        if not x86_ops._paddle().in_dynamic_mode():  # the op cannot run now: at the next step
            ORPHANS.append(plan)
            return
        _free(plan)


def _free(plan: int) -> None:
    _LIVE.discard(plan)
    load_ops().fd_x86_run_plan_free(_any_tensor(), plan)


def free_orphans() -> None:
    while ORPHANS:
        _free(ORPHANS.pop())


@functools.lru_cache(maxsize=1)
def _any_tensor() -> Any:
    return x86_ops._paddle().zeros([1], dtype="float32")


@atexit.register
def _free_all() -> None:
    """Free every live plan while Python and paddle still run (atexit handlers run before paddle's
    teardown and the C++ static destructors): the weights a plan holds may be memory Python owns."""
    ORPHANS.clear()
    try:
        if x86_ops._paddle().in_dynamic_mode():
            for plan in list(_LIVE):
                _free(plan)
    finally:
        _EXITING.append(True)
