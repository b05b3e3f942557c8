"""Wrapping an engine core for its ``--splitwise-role``.

Called where an ``EngineCore`` is built (the engine process, the offline
``LLMEngine``): ``disaggregate(core, args)`` returns the core itself for
``mixed``, else a ``PrefillEngine`` or ``DecodeEngine`` around it, which the
caller drives exactly as an EngineCore.
"""

from __future__ import annotations

from typing import Any

from fd_core import envs
from fd_core.disagg.config import disagg_config_from

__all__ = ["disaggregate"]


def disaggregate(core: Any, args: Any) -> Any:
    """``core``, or its prefill/decode wrapper; ValueError naming a bad flag."""
    config = disagg_config_from(args, timeout_s=float(envs.get("FD_PD_TRANSFER_TIMEOUT")),
                                allowed=envs.get("FD_PD_ALLOWED_PREFILL_ADDRS"))
    if config is None:
        return core
    if config.role == "prefill":
        from fd_core.disagg.prefill import PrefillEngine

        return PrefillEngine(core, config)
    from fd_core.disagg.decode import DecodeEngine

    return DecodeEngine(core, config)
