"""What every conformance case uses: the backend under test beside the CPU
reference, moving data to each, calling an op while noting who answered, and
comparing outputs on the host.

The reference always computes in fp32 on the host from the *same* values the
backend received (inputs are rounded through the backend's compute dtype
first), so a difference is the kernel's, not the data's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.backends import Backend, OpNotProvidedError
from fd_core.testing.conformance import KERNEL_OPS

__all__ = [
    "DEFAULT_TOLERANCES",
    "KERNEL_OPS",
    "Harness",
    "Tolerance",
    "answer_label",
    "case_rng",
    "replace_tensors",
]

paddle = import_paddle()

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Tolerance:
    """Elementwise bound ``|got - want| <= atol + rtol * |want|``."""

    rtol: float
    atol: float

    def looser(self, other: Tolerance) -> Tolerance:
        return Tolerance(max(self.rtol, other.rtol), max(self.atol, other.atol))


# Per compute dtype; outputs of the cases are O(1) by construction.
DEFAULT_TOLERANCES = {
    "float32": Tolerance(rtol=1e-4, atol=1e-4),
    "float16": Tolerance(rtol=1e-2, atol=1e-2),
    "bfloat16": Tolerance(rtol=4e-2, atol=4e-2),
}

NATIVE = "native"
REFERENCE = "reference (the backend under test is the reference)"
FALLBACK = "reference fallback"
DECLINED = "reference fallback (backend returned None)"
COMPOSED = "unfused hooks (no fused kernel answered)"


def answer_label(backend_implements: bool, backend_answered: bool, is_reference: bool) -> str:
    if is_reference:
        return REFERENCE
    if backend_answered:
        return NATIVE
    return DECLINED if backend_implements else FALLBACK


@dataclass
class Harness:
    """The backend under test, the CPU reference, and how to compare them."""

    backend: Backend
    reference: Backend
    reference_module: ModuleType
    place: str  # what backend.set_device(0) returned
    dtype: str  # compute dtype of float inputs given to the backend
    tolerance: Tolerance  # for ``dtype``; fp32-only outputs use DEFAULT_TOLERANCES too
    override: Tolerance | None = None  # --fd-rtol/--fd-atol, wins over every default
    answers: dict[str, set[str]] = field(default_factory=dict)  # op -> who answered, this test

    @property
    def is_reference(self) -> bool:
        return self.backend.name == self.reference.name

    def implements(self, op: str) -> bool:
        """Whether the backend itself (not the reference) has a hook for ``op``."""
        impls = getattr(self.backend.pm.hook, "fd_" + op).get_hookimpls()
        return any(impl.plugin is not self.reference_module for impl in impls)

    def tol(self, *dtypes: str) -> Tolerance:
        """The tolerance for outputs computed from inputs of ``dtypes``."""
        if self.override is not None:
            return self.override
        result = DEFAULT_TOLERANCES["float32"]
        for dtype in dtypes or (self.dtype,):
            result = result.looser(DEFAULT_TOLERANCES.get(dtype, self.tolerance))
        return result

    # ------------------------------------------------------------- calling

    def call(self, op: str, **kwargs: Any) -> Any:
        """Call op ``op`` on the backend (keyword arguments of its hook), the
        way the model does: the backend first, the reference if it declines.
        Notes who answered in ``answers``."""
        hook_name = "fd_" + op
        implements = self.implements(op)
        result = None
        if implements:
            only_backend = self.backend.pm.subset_hook_caller(
                hook_name, remove_plugins=[self.reference_module]
            )
            result = only_backend(**kwargs)
        answered = result is not None
        if not answered:
            result = getattr(self.backend.pm.hook, hook_name)(**kwargs)
        self.answers.setdefault(op, set()).add(answer_label(implements, answered, self.is_reference))
        if result is None:
            raise OpNotProvidedError(
                f"{op}: neither backend {self.backend.name!r} nor the CPU reference answered"
            )
        return result

    def call_fused(self, op: str, **kwargs: Any) -> Any:
        """An optional fused op (no reference numerics of its own): the
        backend's kernel when it answers, else what the model runs then, the
        ``Ops`` method composing the unfused hooks."""
        if op == "decoder_layers":
            kwargs.setdefault("head", None)  # a run without the model's head (call_run hands one over)
        result = None
        if self.implements(op) and not self.is_reference:
            only_backend = self.backend.pm.subset_hook_caller(
                "fd_" + op, remove_plugins=[self.reference_module]
            )
            result = only_backend(**kwargs)
        self.answers.setdefault(op, set()).add(NATIVE if result is not None else COMPOSED)
        return result if result is not None else getattr(self.backend.ops, op)(**kwargs)

    def call_run(self, **kwargs: Any) -> Any:
        """``decoder_layers`` on a run whose MoE layers carry their block or
        that ends with the model's head (``head``): the backend's kernel when
        its plugin declares the run's flags (``FD_DECODER_LAYERS_MOE``,
        ``FD_DECODER_LAYERS_HEAD``, ``FD_DECODER_LAYERS_EMBEDDING`` for a run
        that starts at a ``DecoderEmbedding``) and answers, else what the model
        runs then (``Ops.decoder_layers`` takes the embedding's rows first,
        splits the run at its MoE layers, runs the head's own hooks after it)."""
        flags = [flag for flag, needed in (
            ("FD_DECODER_LAYERS_MOE", any(getattr(layer, "moe", None) is not None for layer in kwargs["layers"])),
            ("FD_DECODER_LAYERS_HEAD", kwargs.get("head") is not None),
            ("FD_DECODER_LAYERS_EMBEDDING", not hasattr(kwargs["hidden"], "shape"))) if needed]
        kwargs.setdefault("head", None)
        impls = self.backend.pm.hook.fd_decoder_layers.get_hookimpls()
        others = [impl.plugin for impl in impls if not all(getattr(impl.plugin, f, False) for f in flags)]
        result = None
        if not self.is_reference and len(others) < len(impls):
            result = self.backend.pm.subset_hook_caller("fd_decoder_layers", remove_plugins=others)(**kwargs)
        self.answers.setdefault("decoder_layers", set()).add(NATIVE if result is not None else COMPOSED)
        return result if result is not None else self.backend.ops.decoder_layers(**kwargs)

    def call_reference(self, op: str, **kwargs: Any) -> Any:
        """Call op ``op`` on the CPU reference with host tensors."""
        with self.on_host():
            result = getattr(self.reference.pm.hook, "fd_" + op)(**kwargs)
        if result is None:
            raise OpNotProvidedError(f"{op}: the CPU reference has no numerics for these arguments")
        return result

    @contextlib.contextmanager
    def on_host(self) -> Iterator[None]:
        """Run paddle on the CPU inside the block (tensors made without a
        place land there), then return to the backend's device."""
        previous = paddle.get_device()
        paddle.set_device("cpu")
        try:
            yield
        finally:
            paddle.set_device(previous)

    # ---------------------------------------------------------------- data

    def rounded(self, array: np.ndarray, dtype: str | None = None) -> np.ndarray:
        """``array`` (fp32) rounded through ``dtype`` (default: the compute
        dtype), as fp32: the values the backend will actually see."""
        dtype = dtype or self.dtype
        array = np.ascontiguousarray(array, dtype=np.float32)
        if dtype == "float32":
            return array
        host = paddle.to_tensor(array, place=paddle.CPUPlace())
        return host.astype(dtype).astype("float32").numpy()  # type: ignore[no-any-return]

    def device(self, array: np.ndarray, dtype: str | None = None) -> Any:
        """A tensor on the backend's device; float arrays are cast to ``dtype``
        (default: the compute dtype), integer arrays keep theirs."""
        tensor = paddle.to_tensor(np.ascontiguousarray(array), place=self.place)
        if np.issubdtype(array.dtype, np.floating):
            tensor = tensor.astype(dtype or self.dtype)
        return tensor

    def host(self, array: np.ndarray) -> Any:
        """A host tensor for the reference (floats as fp32)."""
        array = np.ascontiguousarray(array)
        if np.issubdtype(array.dtype, np.floating):
            array = array.astype(np.float32)
        return paddle.to_tensor(array, place=paddle.CPUPlace())

    @staticmethod
    def numpy(tensor: Any) -> np.ndarray:
        """A tensor's values on the host; floats as fp32."""
        if tensor.dtype in (paddle.float16, paddle.bfloat16, paddle.float64):
            tensor = tensor.astype("float32")
        return tensor.cpu().numpy()  # type: ignore[no-any-return]

    # ----------------------------------------------------------- comparing

    def who(self, op: str) -> str:
        """Which plugin answered ``op`` and the other ops of this case."""
        ops = [op] + sorted(o for o in self.answers if o != op)
        answered = "; ".join(f"{o}: {', '.join(sorted(self.answers.get(o, ()))) or 'not called'}"
                             for o in ops)
        return f"backend {self.backend.name!r}; {answered}"

    def assert_close(self, op: str, case: str, got: Any, want: Any, tol: Tolerance) -> None:
        """Fail naming op, case, shapes and the worst abs/rel error."""
        got_np, want_np = _as_array(got), _as_array(want)
        where = f"{op} [{case}] ({self.who(op)})"
        if got_np.shape != want_np.shape:
            raise AssertionError(
                f"{where}: output shape {list(got_np.shape)}, reference {list(want_np.shape)}"
            )
        if got_np.size == 0:
            return
        if not np.isfinite(got_np).all():
            nonfinite = int((~np.isfinite(got_np)).sum())
            raise AssertionError(f"{where}: {nonfinite} of {got_np.size} outputs are not finite")
        got64, want64 = got_np.astype(np.float64), want_np.astype(np.float64)
        abs_err = np.abs(got64 - want64)
        rel_err = abs_err / np.maximum(np.abs(want64), 1e-12)
        bad = abs_err > tol.atol + tol.rtol * np.abs(want64)
        if bad.any():
            worst = np.unravel_index(int(np.argmax(abs_err)), abs_err.shape)
            raise AssertionError(
                f"{where}: {int(bad.sum())} of {got_np.size} elements of shape "
                f"{list(got_np.shape)} outside atol={tol.atol:g} rtol={tol.rtol:g}; "
                f"max abs err {abs_err.max():.3e} at {list(map(int, worst))} "
                f"(got {got64[worst]:.6g}, reference {want64[worst]:.6g}); "
                f"max rel err {rel_err[bad].max():.3e}"
            )

    def assert_equal(self, op: str, case: str, got: Any, want: Any) -> None:
        """Exact equality (token ids, expert ids)."""
        got_np, want_np = _as_array(got), _as_array(want)
        where = f"{op} [{case}] ({self.who(op)})"
        if got_np.shape != want_np.shape:
            raise AssertionError(
                f"{where}: output shape {list(got_np.shape)}, reference {list(want_np.shape)}"
            )
        diff = np.argwhere(got_np != want_np)
        if len(diff):
            first = tuple(int(i) for i in diff[0])
            raise AssertionError(
                f"{where}: {len(diff)} of {got_np.size} values differ; first at {list(first)}: "
                f"got {got_np[first]}, reference {want_np[first]}"
            )


def case_rng(*key: Any) -> np.random.Generator:
    """A generator seeded by the case's parameters (stable across processes)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    return Harness.numpy(value)


def replace_tensors(obj: Any, convert: Any) -> Any:
    """A copy of dataclass ``obj`` with every tensor field passed through ``convert``."""
    changes = {
        f.name: convert(getattr(obj, f.name))
        for f in dataclasses.fields(obj)
        if isinstance(getattr(obj, f.name), paddle.Tensor)
    }
    return dataclasses.replace(obj, **changes)
