"""fd-core: an LLM inference and serving engine on PaddlePaddle.

Importing fd_core is cheap: no paddle, no model code. Paddle is imported
when a backend's kernels or a model are first used; if no paddle build is
installed, that point raises an error saying which package to install.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]


def __getattr__(name: str) -> Any:
    # Lazy exports: the offline API pulls in the engine only when asked for.
    if name == "LLM":
        from fd_core.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from fd_core.sampling.params import SamplingParams

        return SamplingParams
    if name in ("RequestOutput", "CompletionOutput"):
        from fd_core.engine import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'fd_core' has no attribute {name!r}")
