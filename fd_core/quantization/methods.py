"""The registry of quantization methods, by the names ``--quantization`` takes.

A method is a ``QuantMethod``: how a float ``[in, out]`` weight becomes its
stored form (``quantize``) and the reference numerics of a linear layer on
that form (``linear``). Built-in methods are imported when first used, so
this module (and argument validation in the API process) needs no paddle.
FastDeploy's methods that fd-core does not implement yet are registered as
*refused*: naming one fails with a message saying so, never silently.
General plugins (entry-point group ``fd_core.plugins``) add methods through
the ``fd_register_quantization_methods`` hook, called once, the first time
the registry is used.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MethodRegistry", "QuantMethod", "registry"]

# numpy [in, out] float32, group_size -> (qweight, scales) numpy arrays in the method's layout
QuantizeFn = Callable[[Any, int], tuple[Any, Any]]
# (x [T, in] paddle, QuantizedWeight) -> [T, out]: the reference numerics
LinearFn = Callable[[Any, Any], Any]
# (qweight, scales) paddle -> float32 [in, out]: for layouts weights.dequantize does not know
DequantizeFn = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class QuantMethod:
    """One quantization method (implemented, or refused with a reason)."""

    name: str  # as --quantization spells it
    summary: str  # one line for listings and messages
    quantize: QuantizeFn | None = None
    linear: LinearFn | None = None  # reference ``x @ W`` on the quantized form
    grouped: bool = False  # takes a group size (scales per group of ``in`` indices)
    refused: str = ""  # non-empty: not implemented; says why and what to use instead
    dequantize: DequantizeFn | None = None  # its own layout's dequantizer (None: wint8/wint4's)

    @property
    def implemented(self) -> bool:
        return not self.refused and self.quantize is not None and self.linear is not None


def _lazy(target: str) -> Callable[..., Any]:
    """A function that imports ``"module:attr"`` when first called (keeps paddle out of this module)."""

    def call(*args: Any) -> Any:
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)(*args)

    return call


_NOT_YET = ("is not implemented in fd-core yet (issue 22); use wint8, wint4, w8a8, w4a8, w4afp8 or block_wise_fp8, "
            "or run without --quantization")
_REFUSED = [
    QuantMethod("tensor_wise_fp8", "tensor-wise fp8 weights and activations",
                refused=f"tensor-wise fp8 {_NOT_YET}"),
    QuantMethod("wfp8afp8", "fp8 weights and activations", refused=f"fp8 weights and activations {_NOT_YET}"),
    # reference numerics exist (fd_core.quantization.wint2) for weights an offline
    # checkpoint supplies; a float model is never quantized to wint2 (nor in FastDeploy)
    QuantMethod("wint2", "2-bit weights (offline-quantized checkpoints)",
                linear=_lazy("fd_core.quantization.wint2:wint2_linear"),
                dequantize=_lazy("fd_core.quantization.wint2:dequantize_wint2"),
                refused="wint2 (FastDeploy's 2-bit MoE experts) comes only from offline-quantized checkpoints "
                        "(ERNIE 4.5 2Bits), which fd-core loads as stored, detected from their config.json "
                        "(no --quantization needed); quantizing a float checkpoint to it is not implemented "
                        "(nor in FastDeploy): use wint4, w4a8 or block_wise_fp8"),
    # FastDeploy's W4A8 experts as its offline W4A8C8 checkpoints store them: static per-expert
    # activation scales (fd_core.quantization.w4a8); read from those checkpoints only
    QuantMethod("w4a8_static", "int4 experts with static per-expert int8 activation scales (offline W4A8C8)",
                linear=_lazy("fd_core.quantization.w4a8:w4a8_static_linear"),
                dequantize=_lazy("fd_core.quantization.w4a8:dequantize_w4a8_static"),
                refused="w4a8_static (int4 experts with the static activation scales of FastDeploy's offline "
                        "W4A8C8 checkpoints) comes only from those checkpoints, loaded as stored without a flag; "
                        "for a float checkpoint use w4a8 (per-token dynamic activation scales)"),
    QuantMethod("weight_only", "FastDeploy's generic weight-only config",
                refused="weight_only with an 'algo' key is not supported; name the method: wint8 or wint4"),
    QuantMethod("kvcache", "KV-cache int8/fp8",
                refused="KV-cache quantization is not implemented in fd-core yet (issue 15); the KV cache stays float32"),
]
_BUILTINS = {
    "wint8": "fd_core.quantization.wint:WINT8",
    "wint4": "fd_core.quantization.wint:WINT4",
    "w8a8": "fd_core.quantization.w8a8:W8A8",
    "block_wise_fp8": "fd_core.quantization.block_fp8:BLOCK_WISE_FP8",
    "w4a8": "fd_core.quantization.w4a8:W4A8",
    "w4afp8": "fd_core.quantization.w4afp8:W4AFP8",
}


class MethodRegistry:
    """Method name -> ``QuantMethod`` (or ``"module:attr"``, imported lazily)."""

    def __init__(self) -> None:
        self._entries: dict[str, QuantMethod | str] = {m.name: m for m in _REFUSED}
        self._entries.update(_BUILTINS)
        self._plugins_loaded = False
        self._lock = threading.Lock()

    def register(self, name: str, method: QuantMethod | str) -> None:
        """Add or replace a method (a ``QuantMethod`` or ``"module:attr"``)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a quantization method needs a non-empty name, got {name!r}")
        self._entries[name.strip().lower()] = method

    def _load_plugins(self) -> None:
        with self._lock:
            if self._plugins_loaded:
                return
            self._plugins_loaded = True
        from fd_core.plugins import manager

        modules = manager.load_general_plugins()
        if modules:
            manager.make_plugin_manager(*modules).hook.fd_register_quantization_methods(registry=self)

    def names(self, implemented: bool | None = None) -> list[str]:
        """Registered names; ``implemented=True`` only those that run,
        ``False`` only the refused ones."""
        self._load_plugins()
        if implemented is None:
            return sorted(self._entries)
        return sorted(n for n, e in self._entries.items()
                      if (isinstance(e, str) or e.implemented) == implemented)

    def find(self, name: str) -> QuantMethod | None:
        """The method called ``name``, or None."""
        self._load_plugins()
        key = name.strip().lower() if isinstance(name, str) else ""
        entry = self._entries.get(key)
        if isinstance(entry, str):
            module, attr = entry.split(":")
            entry = getattr(importlib.import_module(module), attr)
            self._entries[key] = entry
        return entry

    def is_known(self, name: str) -> bool:
        self._load_plugins()
        return isinstance(name, str) and name.strip().lower() in self._entries

    def refusal(self, name: str) -> str:
        """Why ``name`` cannot be used ("" when it can); built-ins are not imported."""
        self._load_plugins()
        entry = self._entries.get(name.strip().lower())
        if entry is None or isinstance(entry, str):
            return ""
        if entry.refused:
            return entry.refused
        if not entry.implemented:
            return f"{name} has no quantizer or reference numerics"
        return ""


registry = MethodRegistry()
