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
memory traffic (the 0.3B: 103424 x 1024). With tied embeddings the lookup
table stays float and a quantized head gets its own copy. ``lm_head_fp32``
(the engine's ``--lm_head-fp32``) forces the float head and refuses an
explicit ``lm_head_quant_type`` method beside it.

Like FastDeploy, plain ``wint4`` on an ERNIE model keeps the dense layers
(attention, dense MLPs, shared experts) at wint8 and quantizes only the
routed experts to wint4; a dense ERNIE model therefore runs all-wint8 under
``wint4``. Use the mixed form to get wint4 dense layers. FastDeploy methods
not implemented here (block_wise_fp8, w4a8, wint2, ...) and KV-cache
quantization (``kv_cache_quant_type``) are refused with a message saying so.
Pure Python: the API process validates flags with it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from fd_core.config import UnsupportedFeatureError
from fd_core.quantization.methods import registry

__all__ = ["QuantizationConfig", "check_backend_supports", "parse_quantization"]

DEFAULT_GROUP_SIZE = 128
_KEYS = ("quantization", "group_size", "dense_quant_type", "moe_quant_type", "lm_head_quant_type",
         "kv_cache_quant_type")
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

    def methods(self, has_experts: bool = True) -> tuple[str, ...]:
        """The methods a model with (or without) routed experts uses."""
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
        parts = [] if self.dense_method == self.moe_method == self.method else (
            [self.dense_method] if self.dense_method == self.moe_method
            else [f"dense {self.dense_method}", f"experts {self.moe_method}"])
        if "wint4" in (self.dense_method, self.moe_method):
            parts.append("per-channel" if self.group_size == -1 else f"group size {self.group_size}")
        parts.append(f"lm_head {self.lm_head_method}" if self.lm_head_method else "lm_head float")
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


def parse_quantization(value: str | dict[str, Any] | None, architecture: str | None = None,
                       lm_head_fp32: bool = False) -> QuantizationConfig | None:
    """None when unquantized; raises ``UnsupportedFeatureError`` for methods
    that are not implemented and ``ValueError`` for malformed values.

    ``lm_head_fp32`` (``--lm_head-fp32``) keeps the LM head float whatever
    the quantization; with an explicit ``lm_head_quant_type`` method too it
    raises ``ValueError`` naming both, rather than drop one silently."""
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
    if spec.get("kv_cache_quant_type") not in (None, "", "none"):
        raise UnsupportedFeatureError(
            f"--quantization kv_cache_quant_type {spec['kv_cache_quant_type']}: KV-cache quantization "
            "is not implemented in fd-core yet (issue 15); the KV cache stays float32"
        )
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
    config = QuantizationConfig(method, dense, moe, group_size, mixed, lm_head)
    return config.for_architecture(architecture) if architecture else config


def check_backend_supports(backend_name: str, supported: tuple[str, ...], config: QuantizationConfig,
                           has_experts: bool) -> None:
    """Raise ``UnsupportedFeatureError`` when the backend's kernels cannot run
    a method the model would use (``supported``: its capabilities' list)."""
    missing = [m for m in config.methods(has_experts) if m not in supported]
    if missing:
        listed = ", ".join(supported) if supported else "none"
        raise UnsupportedFeatureError(
            f"--quantization {config.describe()}: backend {backend_name!r} cannot run "
            f"{', '.join(missing)}; its quantization methods: {listed}. Choose one of those, "
            "another --backend, or run without --quantization"
        )
