"""FastDeploy's offline-quantized checkpoints, detected from their ``config.json``.

Baidu publishes ERNIE 4.5 checkpoints already quantized (``-FP8-Paddle``,
``-W4A8C8-TP4-Paddle``, ``-2Bits-Paddle``); their ``config.json`` carries a
``quantization_config`` and the weights are stored as FastDeploy's
``quant_weight`` / ``weight_scale`` / ... tensors (layouts and sources:
``OFFLINE_FORMATS.md`` beside this file). ``read_offline`` turns that config
into an ``OfflineQuantization``; ``checkpoint_quantization`` combines it with
``--quantization``: an offline checkpoint needs no flag, a flag naming the
same format is accepted, and any other is refused naming both (FastDeploy
silently lets the checkpoint win; fd-core says so instead).

Detection follows FastDeploy's ``parse_quant_config`` for Paddle checkpoints:
the weights are pre-quantized when ``is_quantized`` (top level or inside
``quantization_config``) is true, or when ``quantization_config`` has neither
``is_quantized`` nor only ``kv_cache_quant_type``. A config with
``"is_quantized": false`` is an online spec: its keys act as the default
``--quantization`` (FastDeploy quantizes at load). Pure Python, no paddle:
the engine core calls ``checkpoint_quantization`` before loading, and
``fd_core.model_loader.loader`` calls ``read_offline`` for direct
``load_model`` callers; the loading itself is
``fd_core.quantization.prequantized``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fd_core.errors import UnsupportedFeatureError

__all__ = ["OfflineQuantization", "checkpoint_quantization", "read_offline"]

# FastDeploy's kv_cache_quant_type -> fd-core's KV dtype
_KV = {"int8": "int8", "float8_e4m3fn": "fp8", "block_wise_fp8": "fp8"}
# stored layouts fd-core reads: dense (linear layers) and MoE (routed experts)
_DENSE = ("wint8", "block_wise_fp8")
_MOE = {"wint8": "wint8", "wint4": "wint4", "block_wise_fp8": "block_wise_fp8", "w4a8": "w4a8_static"}


@dataclass(frozen=True)
class OfflineQuantization:
    """What an offline-quantized checkpoint stores, layer kind by layer kind."""

    format: str  # "block_wise_fp8" (FP8), "mix_quant" (e.g. W4A8C8), "wint2" (2Bits)
    dense_method: str  # fd-core method of the linear layers: wint8 or block_wise_fp8
    moe_method: str  # routed experts: block_wise_fp8, w4a8_static, wint8, wint4 or wint2
    kv_cache_quant_type: str | None = None  # FastDeploy's name (int8 -> static per-channel scales)
    moe_w4_end_layer: int = -1  # wint2: MoE layers up to this index store wint4 (per channel) experts
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def kv_cache_dtype(self) -> str | None:
        """fd-core's KV dtype for ``kv_cache_quant_type`` (None: float KV)."""
        return _KV.get(self.kv_cache_quant_type or "")

    @property
    def static_kv_scales(self) -> bool:
        """The checkpoint stores ``cachek_matmul`` / ``cachev_matmul`` activation scales."""
        return self.kv_cache_quant_type in ("int8", "float8_e4m3fn")

    def moe_method_of(self, layer: int) -> str:
        """The routed experts' method in decoder layer ``layer`` (wint2: wint4 up to moe_w4_end_layer)."""
        if self.moe_method == "wint2" and layer <= self.moe_w4_end_layer:
            return "wint4"
        return self.moe_method

    def methods(self) -> tuple[str, ...]:
        used = {self.dense_method, self.moe_method}
        if self.moe_method == "wint2" and self.moe_w4_end_layer >= 0:
            used.add("wint4")
        return tuple(sorted(used))

    def describe(self) -> str:
        kv = ""
        if self.kv_cache_quant_type:  # int8's static scales are applied (int8_static); fp8's are not
            kv = f", kv cache {self.kv_cache_quant_type}" + (" static per channel" if self.kv_cache_dtype == "int8"
                                                            else "")
        experts = self.moe_method
        if self.moe_method == "wint2" and self.moe_w4_end_layer >= 0:
            experts = f"wint4 to layer {self.moe_w4_end_layer}, then wint2"
        return (f"offline-quantized checkpoint ({self.format}: dense {self.dense_method}, "
                f"experts {experts}{kv}, lm_head float)")


def _is_prequantized(config: dict[str, Any], qc: dict[str, Any]) -> bool:
    if "is_quantized" in config:
        return bool(config["is_quantized"])
    if "is_quantized" in qc:
        return bool(qc["is_quantized"])
    return set(qc) != {"kv_cache_quant_type"} and "quantization" in qc


def _kv_type(qc: dict[str, Any]) -> str | None:
    kv = qc.get("kv_cache_quant_type")
    if kv in (None, "", "none"):
        return None
    if kv not in _KV:
        raise UnsupportedFeatureError(
            f"checkpoint quantization_config: kv_cache_quant_type {kv!r} is not supported by fd-core; "
            f"supported: {', '.join(_KV)}")
    return str(kv)


def read_offline(config: dict[str, Any]) -> OfflineQuantization | None:
    """The offline quantization a checkpoint's parsed ``config.json`` declares,
    or None (no ``quantization_config``, or one with ``is_quantized`` false).
    Raises ``UnsupportedFeatureError`` naming a stored format fd-core cannot read."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict) or not _is_prequantized(config, qc):
        return None
    name = qc.get("quantization")
    kv = _kv_type(qc)
    if name == "block_wise_fp8":
        block = list(qc.get("weight_block_size", [128, 128]))
        if block != [128, 128]:
            raise UnsupportedFeatureError(f"checkpoint quantization_config: block_wise_fp8 weight_block_size "
                                          f"{block}; fd-core reads [128, 128] blocks only")
        return OfflineQuantization("block_wise_fp8", "block_wise_fp8", "block_wise_fp8", kv, raw=qc)
    if name == "wint2":
        dense = qc.get("dense_quant_type", "wint8")
        moe_cfg = qc.get("moe_quant_config", {}) or {}
        w4 = moe_cfg.get("moe_w4_quant_config", {}) or {}
        w2 = moe_cfg.get("moe_w2_quant_config", {}) or {}
        if dense != "wint8" or qc.get("moe_quant_type", "w4w2") != "w4w2" or \
                w4.get("quant_granularity", "per_channel") != "per_channel" or \
                int(w2.get("quant_group_size", 64)) != 64:
            raise UnsupportedFeatureError(
                f"checkpoint quantization_config: wint2 with dense_quant_type {dense!r}, moe_quant_type "
                f"{qc.get('moe_quant_type')!r}, w4 granularity {w4.get('quant_granularity')!r}, w2 group size "
                f"{w2.get('quant_group_size')!r}; fd-core reads ERNIE 4.5 2Bits' form (wint8, w4w2, "
                "per_channel, 64)")
        return OfflineQuantization("wint2", "wint8", "wint2", kv, int(w4.get("quant_end_layer", 6)), raw=qc)
    if name == "mix_quant":
        dense, moe = qc.get("dense_quant_type"), qc.get("moe_quant_type")
        if dense not in _DENSE or moe not in _MOE:
            raise UnsupportedFeatureError(
                f"checkpoint quantization_config: mix_quant with dense_quant_type {dense!r} and moe_quant_type "
                f"{moe!r}; fd-core reads pre-quantized dense {', '.join(_DENSE)} and experts {', '.join(_MOE)}")
        return OfflineQuantization("mix_quant", str(dense), _MOE[str(moe)], kv, raw=qc)
    raise UnsupportedFeatureError(
        f"checkpoint quantization_config: pre-quantized {name!r} weights are not readable by fd-core; it reads "
        "FastDeploy's block_wise_fp8 (FP8), mix_quant (e.g. W4A8C8) and wint2 (2Bits) checkpoints")


def _flag_matches(value: Any, offline: OfflineQuantization) -> bool:
    """``--quantization`` names what the checkpoint already is (accepted, as FastDeploy does)."""
    spec = value
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            spec = json.loads(value)
        except json.JSONDecodeError:
            return False
    if isinstance(spec, dict):
        if spec.get("quantization") != offline.format:
            return False
        for key in ("dense_quant_type", "moe_quant_type", "kv_cache_quant_type"):
            if key in spec and spec[key] != offline.raw.get(key):
                return False
        return True
    name = str(spec).strip().lower()
    aliases = {offline.format}
    if offline.format == "mix_quant" and offline.moe_method == "w4a8_static":
        aliases.add("w4a8")  # the W4A8C8 checkpoints are launched as W4A8 in FastDeploy's docs
    return name in aliases


def checkpoint_quantization(model_dir: str | Path, value: str | dict[str, Any] | None, architecture: str | None = None,
                            lm_head_fp32: bool = False) -> Any:
    """The ``QuantizationConfig`` to load ``model_dir`` with: the checkpoint's own
    when it is offline-quantized (``value``, ``--quantization``, must then be
    None or name the same format: else ``ValueError`` naming both), else
    ``parse_quantization(value)`` (the checkpoint's online spec when ``value``
    is None and its config has one)."""
    from fd_core.quantization.config import QuantizationConfig, parse_quantization

    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    offline = read_offline(config)
    if offline is None:
        qc = config.get("quantization_config")
        if value is None and isinstance(qc, dict) and "quantization" in qc:
            keys = ("quantization", "dense_quant_type", "moe_quant_type", "kv_cache_quant_type")
            value = {k: qc[k] for k in keys if k in qc}
        return parse_quantization(value, architecture, lm_head_fp32=lm_head_fp32)
    if value is not None and not (isinstance(value, str) and value.strip() in ("", "none", "None")) \
            and not _flag_matches(value, offline):
        raise ValueError(
            f"--quantization {value if isinstance(value, str) else json.dumps(value)} conflicts with the "
            f"checkpoint in {model_dir}, an {offline.describe()} (its config.json quantization_config); "
            "drop --quantization: the stored format is used as is")
    config_out = QuantizationConfig(offline.format, offline.dense_method, offline.moe_method, -1, True, None,
                                    offline.kv_cache_dtype)
    return dataclasses.replace(config_out, offline=offline)
