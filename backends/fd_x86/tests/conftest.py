"""Fixtures the fused decoder-layer tests share (``test_x86_layer*.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

# every environment switch the fused run reads (fd_x86.layer, fd_x86.run_step, fd_x86.moe, fd_x86.linear)
FUSED_SWITCHES = ("FD_X86_FUSED_LAYER", "FD_X86_FUSED_MOE_ATTENTION", "FD_X86_FUSED_MOE_RUN", "FD_X86_FUSED_HEAD",
                  "FD_X86_FUSED_EMBEDDING", "FD_X86_RUN_PLAN", "FD_X86_MOE_LAYER", "FD_X86_MOE_NATIVE",
                  "FD_X86_PREFILL_INT8_ACT", "FD_X86_INT4_BF16", "FD_X86_INT8_BF16")


@pytest.fixture(scope="module")
def x86_ops() -> Any:
    """The x86 backend's ``Ops``."""
    from fd_core.backends import get_backend

    return get_backend("x86").ops


@pytest.fixture
def fused_switches_unset(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test starts with every fused-run switch unset (two of them are read once and cached)."""
    import fd_x86.layer as fused

    for name in FUSED_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    fused._enabled.cache_clear()
    fused._attention_only_enabled.cache_clear()
    yield
    fused._enabled.cache_clear()
    fused._attention_only_enabled.cache_clear()
