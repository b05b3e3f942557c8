"""Checking what the offline ``LLM`` is given: prompts, FastDeploy-only and
vLLM-only arguments, and a tool-parser plugin file.

Each check raises ValueError/TypeError naming the bad value; an argument for
a feature fd-core lacks is refused by name, never ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["Prompt", "check_prompt", "indexed", "prompts_of",
           "refuse_unsupported"]

logger = logging.getLogger("fd_core.entrypoints.llm")

Prompt = str | list[int] | dict[str, Any]

_PROMPT_KEYS = ("prompt", "prompt_token_ids")
_MULTIMODAL_KEYS = ("multimodal_data", "multi_modal_data", "mm_processor_kwargs")


def prompts_of(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int):
        return [list(prompts)]  # type: ignore[arg-type]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a string, a list of token ids, a dict or a list of these, "
                        f"got {type(prompts).__name__}")
    return list(prompts)


def check_prompt(prompt: Any) -> None:
    """Dict prompts: refuse keys the engine would otherwise ignore."""
    if not isinstance(prompt, dict):
        return
    for key in prompt:
        if key in _MULTIMODAL_KEYS:
            raise ValueError(f"{key!r}: multimodal inputs are not implemented in fd-core yet")
        if key not in _PROMPT_KEYS:
            raise ValueError(f"unknown prompt key {key!r}; a prompt dict takes {' and/or '.join(_PROMPT_KEYS)}")


def indexed(exc: Exception, where: str) -> Exception:
    """The same kind of error, its message prefixed with which prompt it is about."""
    message = f"{where}: {exc}"
    try:
        return type(exc)(message)
    except Exception:  # an exception type with a different constructor
        return ValueError(message) if isinstance(exc, ValueError) else TypeError(message)


_NOT_SUPPORTED = {
    "lora_request": "LoRA adapters are not implemented in fd-core",
    "priority": "priority scheduling is not implemented in fd-core",
    "mm_processor_kwargs": "multimodal inputs are not implemented in fd-core yet",
}


def refuse_unsupported(**arguments: Any) -> None:
    """vLLM arguments for features fd-core lacks: fine when unset, refused by name when set."""
    for name, value in arguments.items():
        if value is not None and value != {}:
            raise TypeError(f"{name}={value!r}: {_NOT_SUPPORTED[name]}; leave it unset")


