"""The token embedding: rows of a ``[V, D]`` table as fp32 activations."""

from __future__ import annotations

from typing import Any

from fd_core._paddle import import_paddle

__all__ = ["embed"]

paddle = import_paddle()


def embed(table: Any, input_ids: Any) -> Any:
    """Rows ``input_ids [T]`` of ``table [V, D]`` as fp32 ``[T, D]``: with 16-bit
    weights the activations stay fp32 (paddle's CPU gather has no fp16 kernel;
    its embedding has). A non-contiguous table is a tied LM head's ``[D, V]``
    seen transposed (``tie_lm_head``): its columns are gathered."""
    if not table.is_contiguous():
        rows = paddle.index_select(table.t(), input_ids, axis=1).t().contiguous()
    elif table.dtype == paddle.float16:
        rows = paddle.nn.functional.embedding(input_ids, table)
    else:
        rows = paddle.gather(table, input_ids)
    return rows if rows.dtype == paddle.float32 else rows.astype("float32")
