"""``--quantization``: parsing FastDeploy's forms into a ``QuantizationConfig``.

Accepted forms (as FastDeploy takes them):

- a method name: ``wint8``, ``wint4``, ``w8a8``;
- JSON: ``{"quantization": "wint4", "group_size": 64}`` (``group_size`` is
  fd-core's key: wint4's scale group along ``in``, 128 by default, -1 per
  channel, which is FastDeploy's own wint4 granularity);
- FastDeploy's mixed form ``{"quantization": "mix_quant",
  "dense_quant_type": "wint8", "moe_quant_type": "wint4"}``;
- fd-core's ``lm_head_quant_type`` in either JSON form: the LM head's method
  (opt-in), or ``"none"`` (the default) to keep it float.

The LM head stays float by default, as in FastDeploy: on random-weight test
models an int8 head doubles the logprob error of the 0.3B shape. Quantizing
it (``"lm_head_quant_type": "wint8"``, per output channel) is opt-in: on a
small model the head is a third of the weights and of the decode step's
memory traffic (the 0.3B: 103424 x 1024). ``"lm_head_quant_type": "wint4"``
gives an int4 head (the group size of the rest): with int4 dense layers
(mix_quant) a float head would otherwise be most of a batch-1 step's bytes
(0.3B under ``--dtype auto``: 212 MB of bf16 head against 135 MB of int4
layers), which is why mix_quant int4 decoded no faster than wint8 there
(``benchmarks/decode_bandwidth.py``). With tied embeddings the lookup
table stays float and a quantized head gets its own copy. ``lm_head_fp32``
(the engine's ``--lm_head-fp32``) forces the float head and refuses an
explicit ``lm_head_quant_type`` method beside it.

Like FastDeploy, plain ``wint4`` on an ERNIE model keeps the dense layers
(attention, dense MLPs, shared experts) at wint8 and quantizes only the
routed experts to wint4; a dense ERNIE model therefore runs all-wint8 under
``wint4``. Use the mixed form to get wint4 dense layers. ``block_wise_fp8``
(``block_fp8``), ``w4a8`` (``w4a8``) and ``w4afp8`` (``w4afp8``) apply to every
linear layer and the routed experts; FastDeploy's expert-only forms are
``"moe_quant_type": "w4a8"`` / ``"w4afp8"`` in mix_quant. FastDeploy methods not
implemented here (tensor_wise_fp8, wfp8afp8, ...) are refused with a message saying so.

FastDeploy's ``kv_cache_quant_type`` (in either JSON form) sets the KV
cache's dtype, as ``--kv-cache-dtype`` does: ``int8`` -> int8,
``float8_e4m3fn`` and ``block_wise_fp8`` -> fp8 (e4m3), each with one fp32
scale per token and KV head (``fd_core.ops.kv_dtype``). An offline
checkpoint whose int8 KV cache carries static per-channel scales (W4A8C8)
gets ``int8_static`` (FastDeploy's C8: its scales applied), and
``--kv-cache-dtype int8`` means that for it. JSON holding only
``kv_cache_quant_type`` quantizes the KV cache and leaves the weights float.
``resolve_kv_cache_dtype`` combines it with ``--kv-cache-dtype`` and the
backend's declared KV dtypes. Pure Python: the API process validates flags
with it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from fd_core.errors import UnsupportedFeatureError
from fd_core.quantization.methods import registry

__all__ = ["KV_CACHE_QUANT_TYPES", "QuantizationConfig", "check_backend_supports", "kv_cache_dtype_from_quantization",
           "parse_quantization", "resolve_kv_cache_dtype"]

DEFAULT_GROUP_SIZE = 128
_KEYS = ("quantization", "group_size", "dense_quant_type", "moe_quant_type", "lm_head_quant_type",
         "kv_cache_quant_type")
# FastDeploy's kv_cache_quant_type -> fd-core's --kv-cache-dtype
KV_CACHE_QUANT_TYPES = {"int8": "int8", "float8_e4m3fn": "fp8", "block_wise_fp8": "fp8"}
# FastDeploy's per-family rule: --quantization wint4 on ERNIE -> dense layers at wint8
_DENSE_OVERRIDES = {("Ernie", "wint4"): "wint8"}


@dataclass(frozen=True)
class QuantizationConfig:
    """Which method each kind of layer is stored with."""

    method: str  # as given: "wint8", "wint4", "w8a8", "mix_quant", or a plugin's
    dense_method: str  # linear layers: qkv, o, dense MLPs, shared experts
    moe_method: str  # routed experts
    group_size: int = DEFAULT_GROUP_SIZE  # grouped methods (wint4); -1 = per channel
    mixed: bool = False  # dense/moe methods were given explicitly (mix_quant)
    # the LM head (also when tied to the embeddings, whose lookup table stays
    # float): None (the default) keeps it float; a method name quantizes it
    lm_head_method: str | None = None
    # the KV cache's dtype from kv_cache_quant_type ("int8", "fp8"); None: not given
    kv_cache_dtype: str | None = None
    # an offline-quantized checkpoint's stored format (fd_core.quantization.offline): the
    # weights are read as stored, not quantized at load
    offline: Any = None

    def methods(self, has_experts: bool = True) -> tuple[str, ...]:
        """The methods a model with (or without) routed experts uses."""
        if self.offline is not None:
            return self.offline.methods() if has_experts else (self.dense_method,)
        used = {self.dense_method, self.moe_method} if has_experts else {self.dense_method}
        if self.lm_head_method:
            used.add(self.lm_head_method)
        return tuple(sorted(used))

    def for_architecture(self, architecture: str) -> QuantizationConfig:
        """Apply FastDeploy's per-family rule (ERNIE: wint4 keeps dense layers at wint8)."""
        if self.mixed:
            return self
        for (prefix, method), dense in _DENSE_OVERRIDES.items():
            if architecture.startswith(prefix) and self.method == method:
                return dataclasses.replace(self, dense_method=dense)
        return self

    def describe(self) -> str:
        """E.g. ``wint4 (dense wint8, experts wint4, group size 128, lm_head float)``."""
        if self.offline is not None:
            return self.offline.describe()
        parts = [] if self.dense_method == self.moe_method == self.method else (
            [self.dense_method] if self.dense_method == self.moe_method
            else [f"dense {self.dense_method}", f"experts {self.moe_method}"])
        if {"wint4", "w4a8", "w4afp8"} & {self.dense_method, self.moe_method}:
            parts.append("per-channel" if self.group_size == -1 else f"group size {self.group_size}")
        parts.append(f"lm_head {self.lm_head_method}" if self.lm_head_method else "lm_head float")
        if self.kv_cache_dtype:
            parts.append(f"kv cache {self.kv_cache_dtype}")
        return f"{self.method} ({', '.join(parts)})"


def _method_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"--quantization: {what} must be a method name, got {value!r}")
    name = value.strip().lower()
    if not registry.is_known(name):
        raise ValueError(
            f"--quantization: unknown method {value!r}; implemented: "
            f"{', '.join(registry.names(True))} (FastDeploy's {', '.join(registry.names(False))} "
            "are not implemented yet: issue 22)"
        )
    refusal = registry.refusal(name)
    if refusal:
        raise UnsupportedFeatureError(f"--quantization {name}: {refusal}")
    return name


def _spec(value: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """The value as a JSON object (a bare method name becomes ``{"quantization": name}``);
    None when unquantized. Raises ``ValueError`` for bad JSON or unknown keys."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "none", "None")):
        return None
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--quantization: not valid JSON ({exc})") from None
    spec: dict[str, Any] = value if isinstance(value, dict) else {"quantization": value}
    unknown = sorted(set(spec) - set(_KEYS))
    if unknown:
        raise ValueError(f"--quantization: unknown key(s) {', '.join(unknown)}; known: {', '.join(_KEYS)}")
    return spec


def _kv_cache_dtype(spec: dict[str, Any]) -> str | None:
    raw = spec.get("kv_cache_quant_type")
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none")):
        return None
    name = raw.strip().lower() if isinstance(raw, str) else raw
    if name not in KV_CACHE_QUANT_TYPES:
        raise ValueError(f"--quantization: kv_cache_quant_type must be one of "
                         f"{', '.join(KV_CACHE_QUANT_TYPES)}, got {raw!r}")
    return KV_CACHE_QUANT_TYPES[name]


def kv_cache_dtype_from_quantization(value: str | dict[str, Any] | QuantizationConfig | None) -> str | None:
    """The KV dtype FastDeploy's ``kv_cache_quant_type`` asks for ("int8" or
    "fp8"), or None when ``value`` does not set it."""
    if isinstance(value, QuantizationConfig):  # an offline checkpoint's (fd_core.quantization.offline)
        offline = value.offline
        if value.kv_cache_dtype == "int8" and offline is not None and offline.static_kv_scales:
            return "int8_static"  # its cachek/cachev_matmul scales are applied (fd_core.ops.kv_dtype)
        return value.kv_cache_dtype
    spec = _spec(value)
    return None if spec is None else _kv_cache_dtype(spec)


def resolve_kv_cache_dtype(requested: str, quantization: str | dict[str, Any] | QuantizationConfig | None,
                           backend_name: str,
                           declared: tuple[str, ...], model_dtype: str = "float32") -> str:
    """The KV pool's dtype: ``--kv-cache-dtype`` (``requested``) or, when that
    is auto, ``kv_cache_quant_type`` from ``--quantization``, else the model's
    dtype (``model_dtype``, the weights' resolved dtype) when the backend
    declares it, else float32. Raises ``ValueError`` when the two flags
    disagree and ``UnsupportedFeatureError`` when the backend does not
    declare the result (``declared``: its ``Capabilities.kv_cache_dtypes``)."""
    from_quant = kv_cache_dtype_from_quantization(quantization)
    if requested == "int8" and from_quant == "int8_static":
        requested = from_quant  # the checkpoint's int8 KV cache is the static one
    if requested == "int8_static" and from_quant != "int8_static":
        raise ValueError("--kv-cache-dtype int8_static needs an offline checkpoint with static per-channel "
                         "KV-cache scales (FastDeploy's W4A8C8: cachek/cachev_matmul.activation_scale); use int8 "
                         "for dynamic per-token scales")
    # auto, or int8 (made int8_static above): the checkpoint's static cache, which this backend lacks
    if from_quant == "int8_static" and requested in ("auto", "int8_static") and from_quant not in declared:
        listed = ", ".join(declared) if declared else "none"
        raise UnsupportedFeatureError(
            "the checkpoint's int8 KV cache has static per-channel scales (FastDeploy's C8, kv_cache_quant_type "
            f"int8 in its quantization_config): it needs a backend that declares the int8_static KV cache (cpu, "
            f"x86); backend {backend_name!r} has {listed}. Use another --backend")
    if requested != "auto" and from_quant is not None and from_quant != requested:
        given = ("the checkpoint's kv_cache_quant_type (int8, static per-channel scales)" if from_quant == "int8_static"
                 else f"--quantization kv_cache_quant_type ({from_quant})")
        raise ValueError(f"--kv-cache-dtype {requested} and {given} disagree; give one of the two")
    if requested != "auto":
        chosen = requested
    elif from_quant is not None:
        chosen = from_quant
    else:
        chosen = model_dtype if model_dtype in declared else "float32"
    if chosen not in declared:
        listed = ", ".join(declared) if declared else "none"
        raise UnsupportedFeatureError(
            f"--kv-cache-dtype {chosen}: backend {backend_name!r} has no KV cache in {chosen}; "
            f"its KV-cache dtypes: {listed}. Choose one of those, or another --backend"
        )
    return chosen


def parse_quantization(value: str | dict[str, Any] | None, architecture: str | None = None,
                       lm_head_fp32: bool = False) -> QuantizationConfig | None:
    """None when unquantized; raises ``UnsupportedFeatureError`` for methods
    that are not implemented and ``ValueError`` for malformed values.

    ``lm_head_fp32`` (``--lm_head-fp32``) keeps the LM head float whatever
    the quantization; with an explicit ``lm_head_quant_type`` method too it
    raises ``ValueError`` naming both, rather than drop one silently."""
    spec = _spec(value)
    if spec is None:
        return None
    kv_dtype = _kv_cache_dtype(spec)
    if "quantization" not in spec and kv_dtype is not None:
        return None  # only the KV cache is quantized: see kv_cache_dtype_from_quantization
    if "quantization" not in spec:
        raise ValueError("--quantization: the JSON form needs a 'quantization' key, e.g. {\"quantization\": \"wint8\"}")
    raw_method = spec["quantization"]
    mixed = isinstance(raw_method, str) and raw_method.strip().lower() == "mix_quant"
    if mixed:
        missing = [k for k in ("dense_quant_type", "moe_quant_type") if k not in spec]
        if missing:
            raise ValueError(f"--quantization mix_quant needs {' and '.join(missing)}")
        method = "mix_quant"
        dense = _method_name(spec["dense_quant_type"], "dense_quant_type")
        moe = _method_name(spec["moe_quant_type"], "moe_quant_type")
    else:
        for key in ("dense_quant_type", "moe_quant_type"):
            if key in spec:
                raise ValueError(f"--quantization: {key} applies only with \"quantization\": \"mix_quant\"")
        method = dense = moe = _method_name(raw_method, "'quantization'")
    group_size = spec.get("group_size", DEFAULT_GROUP_SIZE)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not (
            group_size == -1 or (group_size > 0 and group_size % 2 == 0)):
        raise ValueError(f"--quantization: group_size must be -1 (per channel) or a positive even "
                         f"number, got {group_size!r}")
    raw_head = spec.get("lm_head_quant_type")
    lm_head: str | None = None  # float, as FastDeploy keeps it
    if not (raw_head is None or (isinstance(raw_head, str) and raw_head.strip().lower() in ("", "none", "float"))):
        lm_head = _method_name(raw_head, "lm_head_quant_type")
        if lm_head_fp32:
            raise ValueError(
                f"--lm_head-fp32 keeps the LM head float, but --quantization asks for "
                f"\"lm_head_quant_type\": {raw_head!r}; drop one of the two"
            )
    config = QuantizationConfig(method, dense, moe, group_size, mixed, lm_head, kv_dtype)
    return config.for_architecture(architecture) if architecture else config


def check_backend_supports(backend_name: str, supported: tuple[str, ...], config: QuantizationConfig,
                           has_experts: bool) -> None:
    """Raise ``UnsupportedFeatureError`` when the backend's kernels cannot run
    a method the model would use (``supported``: its capabilities' list)."""
    missing = [m for m in config.methods(has_experts) if m not in supported]
    if missing and config.offline is not None:
        listed = ", ".join(supported) if supported else "none"
        raise UnsupportedFeatureError(
            f"the checkpoint is an {config.describe()}: backend {backend_name!r} cannot run its stored "
            f"{', '.join(missing)}; its quantization methods: {listed}. Run it with another --backend "
            "(cpu runs every stored format)")
    if missing:
        listed = ", ".join(supported) if supported else "none"
        raise UnsupportedFeatureError(
            f"--quantization {config.describe()}: backend {backend_name!r} cannot run "
            f"{', '.join(missing)}; its quantization methods: {listed}. Choose one of those, "
            "another --backend, or run without --quantization"
        )
