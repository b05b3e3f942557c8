"""Backends: the Backend class, the registry, and the built-in CPU reference.

Owns backend discovery/selection (``registry``), the ``Backend``/``Ops``
facade model code calls kernels through (``base``), and the CPU reference
backend (``cpu``), which implements every hook ``trylast`` so hardware
backends fall back to it op by op. May import: fd_core.plugins, fd_core.envs,
fd_core.config (host memory), fd_core._paddle, and (lazily, in the
reference's kernel hooks) fd_core.ops, fd_core.quantization.
"""

from fd_core.backends.base import Backend, OpNotProvidedError, Ops
from fd_core.backends.registry import (
    BackendSelectionError,
    BackendStatus,
    format_listing,
    get_backend,
    list_backends,
    missing_backend_message,
)

__all__ = [
    "Backend",
    "BackendSelectionError",
    "BackendStatus",
    "OpNotProvidedError",
    "Ops",
    "format_listing",
    "get_backend",
    "list_backends",
    "missing_backend_message",
]
