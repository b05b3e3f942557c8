"""A pickle reader for messages from other processes and hosts (the global
scheduler's Redis, prefill/decode KV-transfer peers): it builds only plain
builtins and fd-core's own data classes, so a forged message cannot name a
function to call.

Who calls: ``fd_core.cluster.wire`` and ``fd_core.disagg.wire``. A class is
allowed when its module is one of the caller's ``modules`` (or starts with
one of its ``prefixes``), its name has no dot (pickle resolves a dotted name
attribute by attribute, which would reach any module the class's module
imports), and it is a dataclass, an Enum or a subclass of a builtin container
(``CompletionOutputs`` is a list). Everything else raises
``pickle.UnpicklingError``.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import io
import pickle
from typing import Any

__all__ = ["SAFE_BUILTINS", "restricted_loads"]

SAFE_BUILTINS = frozenset({"dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes", "bool",
                           "complex", "slice", "range"})


_CONTAINERS = (list, dict, tuple, set, frozenset)  # fd-core's container subclasses (CompletionOutputs)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, modules: tuple[str, ...], prefixes: tuple[str, ...], peer: str) -> None:
        super().__init__(io.BytesIO(data))
        self.modules, self.prefixes, self.peer = modules, prefixes, peer

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in SAFE_BUILTINS:
            return getattr(builtins, name)
        allowed = module in self.modules or module.startswith(self.prefixes)
        if allowed and "." not in name:
            try:
                obj = super().find_class(module, name)
            except (ImportError, AttributeError) as exc:
                raise pickle.UnpicklingError(f"{module}.{name} from {self.peer}: {exc}") from None
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, (enum.Enum, *_CONTAINERS))):
                return obj
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from {self.peer}")


def restricted_loads(data: bytes, modules: tuple[str, ...], prefixes: tuple[str, ...] = (),
                     peer: str = "a peer") -> Any:
    """Unpickle ``data`` allowing only safe builtins and the data classes / enums of
    ``modules`` (exact) and ``prefixes``; ``pickle.UnpicklingError`` otherwise."""
    return _Unpickler(data, modules, prefixes, peer).load()
