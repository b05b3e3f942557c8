"""ERNIE-4.5-VL: ``[<think>]reasoning</think>answer``.

Same rules as Qwen3 (see ``reasoning_qwen3``): the text before ``</think>``
is reasoning, the rest content, and an output with no ``</think>`` is all
reasoning, streamed or not (FastDeploy's ``ernie-45-vl`` makes it content
when not streaming only). Registered as ``ernie-45-vl`` (``ernie_45_vl``
also works).
"""

from __future__ import annotations

from fd_core.parsers.reasoning_qwen3 import Qwen3ReasoningParser

__all__ = ["Ernie45VLReasoningParser"]


class Ernie45VLReasoningParser(Qwen3ReasoningParser):
    """``--reasoning-parser ernie-45-vl``."""
