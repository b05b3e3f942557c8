"""Loading an offline-quantized checkpoint's weights as stored.

``fd_core.model_loader.loader`` calls ``install_prequantized`` on a built
model (instead of ``quantize_model``): every linear layer of the decoder
layers and every MoE's routed experts get a ``PrequantizedParam``, which
receives FastDeploy's stored tensors (``quant_weight``, ``weight_scale``, ...)
raw, without casting, and on completion converts them, exactly and without
requantizing, into fd-core's ``QuantizedWeight`` layout for the method
(``fd_core.quantization``'s docstring). ``fd_core.model_loader.offline`` rewrites the
model's checkpoint map (``X.weight`` -> ``X.quant_weight``, ``X.weight_scale``,
...) and adds the static KV-cache scales. Stored layouts (per matrix, Paddle
naming; sources in ``OFFLINE_FORMATS.md``):

- block_wise_fp8: ``quant_weight`` e4m3 ``[in, out]``, ``weight_scale`` float32
  ``[ceil(in/128), ceil(out/128)]`` (fd-core: both transposed);
- wint8 (dense): ``quant_weight`` int8 ``[out, in]``, ``weight_scale`` ``[out]``
  (dequantization scale, ``W = q * s``): fd-core's wint8 as is;
- wint4 (2Bits' first MoE layers, per channel): ``quant_weight`` int8
  ``[in/2, out]`` (low nibble = even input), ``weight_scale`` ``[out]``;
- w4a8 (W4A8C8 experts): wint4's ``quant_weight``, ``weight_scale`` ``[out]``
  (``max |W|``), ``activation_scale`` ``[1]`` (the expert's ``max |x|``);
- wint2: ``fd_core.quantization.wint2``'s five tensors.

Under tensor / expert parallelism a ``PrequantizedParam`` has the rank's local
shape and receives pieces of each stored tensor (``fill_raw``'s ``region``),
cut by ``fd_core.model_loader.offline`` along the axes ``part_axes`` names:
exactly the codes and scales of the rank's slice of the float matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.layers.basic import Linear
from fd_core.layers.mlp import MoE
from fd_core.layers.param import Param, cast_host
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization.apply import _is_layer
from fd_core.quantization.offline import OfflineQuantization
from fd_core.quantization.wint2 import pack_scales

__all__ = ["PrequantizedParam", "install_prequantized", "part_axes", "part_shapes"]

paddle = import_paddle()
_FLOAT_SRC = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "float32": "float32",
              "float16": "float16", "bfloat16": "bfloat16"}


def _blocks(n: int) -> int:
    return (n + 127) // 128


def part_shapes(method: str, in_f: int, out_f: int) -> dict[str, tuple[int, ...]]:
    """The stored tensors of one ``[in, out]`` matrix: suffix -> shape."""
    if method == "block_wise_fp8":
        return {"quant_weight": (in_f, out_f), "weight_scale": (_blocks(in_f), _blocks(out_f))}
    if method == "wint8":
        return {"quant_weight": (out_f, in_f), "weight_scale": (out_f,)}
    if method == "wint4":
        return {"quant_weight": (in_f // 2, out_f), "weight_scale": (out_f,)}
    if method == "w4a8_static":
        return {"quant_weight": (in_f // 2, out_f), "weight_scale": (out_f,), "activation_scale": (1,)}
    if method == "wint2":
        return {"quant_weight": (in_f // 4, out_f), "weight_scale": (in_f // 128, out_f),
                "super_scales": (out_f,), "code_scale": (out_f,), "code_zp": (out_f,)}
    raise ValueError(f"no stored layout for pre-quantized method {method!r}")


# For each stored tensor: how the matrix's (in, out) axes map onto it: (the stored axis,
# matrix elements per stored element along it), or None where it spans the whole axis
# (a per-out-channel scale along ``in``, a per-expert activation scale along both).
Axis = tuple[int, int] | None
_AXES: dict[str, dict[str, tuple[Axis, Axis]]] = {
    "block_wise_fp8": {"quant_weight": ((0, 1), (1, 1)), "weight_scale": ((0, 128), (1, 128))},
    "wint8": {"quant_weight": ((1, 1), (0, 1)), "weight_scale": (None, (0, 1))},
    "wint4": {"quant_weight": ((0, 2), (1, 1)), "weight_scale": (None, (0, 1))},
    "w4a8_static": {"quant_weight": ((0, 2), (1, 1)), "weight_scale": (None, (0, 1)),
                    "activation_scale": (None, None)},
    "wint2": {"quant_weight": ((0, 4), (1, 1)), "weight_scale": ((0, 128), (1, 1)), "super_scales": (None, (0, 1)),
              "code_scale": (None, (0, 1)), "code_zp": (None, (0, 1))},
}


def part_axes(method: str, suffix: str) -> tuple[Axis, Axis]:
    """How stored tensor ``suffix`` of ``method`` follows the matrix's ``in`` and
    ``out`` axes: ``(stored axis, matrix elements per stored element)`` each, or
    None where every slice of that axis takes the tensor whole."""
    try:
        return _AXES[method][suffix]
    except KeyError:
        raise ValueError(f"no stored layout for pre-quantized method {method!r}, tensor {suffix!r}") from None


def _bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).view(np.uint8) if array.dtype.itemsize == 1 else array.astype(np.uint8)


def _convert(method: str, parts: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One matrix's stored tensors -> fd-core's (qweight, scales), exactly."""
    qw, ws = parts["quant_weight"], parts["weight_scale"]
    if method == "block_wise_fp8":
        return np.ascontiguousarray(_bytes(qw).T), np.ascontiguousarray(ws.astype(np.float32).T)
    if method == "wint8":
        return np.ascontiguousarray(qw.astype(np.int8)), ws.astype(np.float32)
    if method == "wint4":
        return np.ascontiguousarray(_bytes(qw).T), ws.astype(np.float32)[:, None]
    if method == "w4a8_static":
        act = np.full_like(ws, parts["activation_scale"].reshape(-1)[0], dtype=np.float32)
        scales = np.stack([ws.astype(np.float32) / np.float32(7.0), act], axis=1)
        return np.ascontiguousarray(_bytes(qw).T), scales.astype(np.float32)
    if method == "wint2":
        return np.ascontiguousarray(_bytes(qw)), pack_scales(_bytes(ws), parts["super_scales"],
                                                             parts["code_scale"], parts["code_zp"])
    raise ValueError(f"no stored layout for pre-quantized method {method!r}")


class PrequantizedParam(Param):
    """A float ``[in, out]`` (or stacked ``[E, in, out]``) weight that the
    checkpoint supplies already quantized with ``method``; the loader hands it
    raw tensors (``fill_raw``), index ``(suffix, expert)`` for a whole stored
    tensor or ``(suffix, expert, region)`` for a piece of it (a parallel rank's)."""

    takes_raw = True

    def __init__(self, shape: tuple[int, ...], method: str, name: str = "") -> None:
        super().__init__(shape)
        self.method = method
        self.group_size = 64 if method == "wint2" else -1
        self.name = name
        self.act_dtype = "float32"  # the model's activation dtype (the loader's --dtype): QuantizedWeight's
        self.in_features, self.out_features = self.shape[-2:]
        self.num_matrices = self.shape[0] if len(self.shape) == 3 else 1
        self.parts = part_shapes(method, self.in_features, self.out_features)
        self._got: dict[tuple[str, int], np.ndarray] = {}
        self._received: dict[tuple[str, int], int] = {}  # elements received per stored tensor

    @property
    def complete(self) -> bool:
        if self.data is not None:
            return True
        return len(self._received) == len(self.parts) * self.num_matrices and all(
            n == int(np.prod(self.parts[key[0]])) for key, n in self._received.items())

    def fill(self, value: np.ndarray, index: tuple[Any, ...] = ()) -> None:
        raise ValueError(f"{self.name}: stored pre-quantized ({self.method}); the checkpoint must give "
                         f"{', '.join(self.parts)}, not a float weight")

    def fill_raw(self, array: np.ndarray, src: str, index: tuple[Any, ...]) -> None:
        """One stored tensor (``src``: its safetensors dtype) for ``index = (suffix, expert)``,
        or a piece of it for ``(suffix, expert, region)``: ``region`` (slices) says where
        the piece lies in this rank's part (``part_shapes`` of the local matrix)."""
        suffix, expert = index[0], index[1]
        codes = suffix == "quant_weight" or (self.method == "wint2" and suffix == "weight_scale")
        allowed = ("I8", "U8", "F8_E4M3", "int8", "uint8") if codes else tuple(_FLOAT_SRC)
        if src not in allowed:  # a corrupt or foreign checkpoint: never cast codes from floats
            raise ValueError(f"{self.name}.{suffix}: stored as {src}, expected "
                             f"{'int8 / uint8 / float8_e4m3 codes' if codes else 'a float tensor (scales)'} "
                             f"for {self.method}")
        value = cast_host(array, _FLOAT_SRC[src], "float32") if src in _FLOAT_SRC else np.array(array)
        key, shape = (suffix, int(expert)), self.parts[suffix]
        if len(index) < 3:
            self._got[key], self._received[key] = value, value.size
            return
        if key not in self._got:
            self._got[key], self._received[key] = np.zeros(shape, dtype=value.dtype), 0
        self._got[key][index[2]] = value
        self._received[key] += value.size

    def finish(self) -> None:
        if not self.complete:
            raise ValueError(f"parameter {self.name} was only partly filled")
        converted = [_convert(self.method, {s: self._got[(s, e)] for s in self.parts})
                     for e in range(self.num_matrices)]
        self._got.clear()
        self._received.clear()
        qweight, scales = (np.stack([c[i] for c in converted]) for i in (0, 1))
        if len(self.shape) == 2:
            qweight, scales = qweight[0], scales[0]
        self.data = QuantizedWeight(self.method, paddle.to_tensor(qweight), paddle.to_tensor(scales),
                                    self.in_features, self.out_features, self.group_size, self.act_dtype)

    def __repr__(self) -> str:
        return f"PrequantizedParam({list(self.shape)}, {self.method})"


def install_prequantized(model: Any, offline: OfflineQuantization) -> int:
    """Before loading (after a parallel transform gave the layers the rank's
    shapes, before the targets are cut): give ``model``'s linear layers (``model.layers``, as
    ``quantize_model`` walks them) and routed experts ``PrequantizedParam``s
    of the checkpoint's methods; the LM head, embeddings, norms and MoE
    router stay float. Returns how many layers were swapped."""
    seen: set[int] = set()
    found = 0

    def walk(obj: Any, name: str, layer: int) -> None:
        nonlocal found
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Linear):
            obj.weight = PrequantizedParam(obj.weight.shape, offline.dense_method, name)
            found += 1
            return
        if isinstance(obj, MoE):
            method = offline.moe_method_of(layer)
            obj.up_gate_proj = PrequantizedParam(obj.up_gate_proj.shape, method, name + ".experts.up_gate_proj")
            obj.down_proj = PrequantizedParam(obj.down_proj.shape, method, name + ".experts.down_proj")
            found += 1
        children = enumerate(obj) if isinstance(obj, (list, tuple)) else getattr(obj, "__dict__", {}).items()
        for key, child in children:
            if isinstance(key, str) and key.startswith("_"):  # a parallel transform's back references
                continue
            if isinstance(child, (list, tuple)) or _is_layer(child):
                walk(child, f"{name}.{key}", layer)

    for i, layer in enumerate(model.layers):
        walk(layer, f"layers.{i}", i)
    return found
