"""Loading a checkpoint into a model, tensor by tensor.

Each checkpoint tensor is read from its memory-mapped file, cast to its
parameter's storage dtype (``--dtype``; a bf16 tensor into a bf16 parameter
is copied bit for bit), transposed/sliced into the parameter's host buffer,
and a parameter moves to
a paddle tensor as soon as it is complete, so peak host memory stays near
the model's size. With quantization the model first swaps its quantizable
weights for ``QuantizedParam``s, which quantize each matrix the moment it is
complete: peak memory is then near the quantized model plus the fp32
matrices being filled, never the fp32 model and the quantized one at once.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from fd_core.errors import UnsupportedFeatureError
from fd_core.layers.param import cast_host
from fd_core.model_loader.accounting import weight_bytes, weight_bytes_by_dtype
from fd_core.model_loader.dtypes import WEIGHT_DTYPES
from fd_core.model_loader.offline import prequantized_targets
from fd_core.model_loader.safetensors_io import SafetensorsError, SafetensorsFile
from fd_core.models import registry
from fd_core.models.config import ModelConfig, load_config
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization.apply import quantize_model
from fd_core.quantization.offline import checkpoint_quantization, read_offline
from fd_core.quantization.prequantized import install_prequantized
from fd_core.quantization.weights import resident_bytes

__all__ = ["CheckpointError", "checkpoint_files", "load_model", "supported_weight_dtypes"]

logger = logging.getLogger(__name__)
GIB = 1 << 30

# Tensors real checkpoints carry that the text model does not use.
_IGNORED = re.compile(r"^(ernie\.|model\.)?mtp|\.rotary_emb\.inv_freq$")


class CheckpointError(ValueError):
    """The checkpoint does not match its config: names the tensor or key."""


def checkpoint_files(model_dir: Path) -> list[Path]:
    """Safetensors files of a checkpoint: the index's shards, or the files."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from None
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shards that do not exist: {', '.join(missing)}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors weights in {model_dir}")
    return files


def _detect_naming(names: list[str]) -> str:
    if any(n.startswith("ernie.") for n in names):
        return "paddle"
    if any(n.startswith("model.") for n in names):
        return "pytorch"
    raise CheckpointError(
        "cannot tell the checkpoint's naming: expected tensors under 'model.' (PyTorch) or "
        f"'ernie.' (Paddle), found e.g. {names[:3]}"
    )


def _place(target: Any, name: str, array: np.ndarray, src_dtype: str) -> None:
    """``array`` (host form of ``src_dtype``) into its target, cast to the
    parameter's storage dtype (a quantized parameter's is fp32)."""
    if tuple(array.shape) != target.source_shape:
        raise CheckpointError(
            f"tensor {name!r} has shape {list(array.shape)}, but the config implies "
            f"{list(target.source_shape)}"
        )
    if target.source_index:  # a slice of the stored tensor (a tensor-parallel rank's part)
        array = array[target.source_index]
    if getattr(target.param, "takes_raw", False):  # pre-quantized: stored codes and scales, uncast
        target.param.fill_raw(array, src_dtype, target.index)
        return
    dst = target.param.dtype
    value = cast_host(array, src_dtype, dst)
    if dst == "float16" and src_dtype != "float16" and not np.isfinite(value).all() \
            and np.isfinite(cast_host(array, src_dtype, "float32")).all():
        raise CheckpointError(
            f"tensor {name!r} has values beyond float16's range (|x| > 65504); load it with "
            "--dtype bfloat16 or float32"
        )
    if target.transpose:
        value = np.swapaxes(value, -1, -2)
    target.param.fill(value, target.index)


def supported_weight_dtypes(model_cls: Any) -> tuple[str, ...]:
    """The storage dtypes a model class declares (``weight_dtypes``); float32 when it declares none."""
    return tuple(getattr(model_cls, "weight_dtypes", ("float32",)))


def _use_dtype(model: Any, dtype: str) -> None:
    """Store every float parameter in ``dtype``, but pinned ones (fp32 by
    design) and quantized ones (filled in fp32, stored as codes), which
    record it as the dtype of the activations they meet (``act_dtype``)."""
    for param in model.parameters().values():
        if getattr(param, "method", None) is not None:
            param.act_dtype = dtype
        elif not param.pinned:
            param.dtype = dtype


def _keep_lm_head_fp32(model: Any) -> None:
    """``--lm_head-fp32``: the LM head's weight stays fp32 whatever ``--dtype``
    (FastDeploy's ``ParallelLMHead`` dtype ``float32``). A head tied to the
    embeddings is filled from the table after loading (``tie_lm_head``): an fp32
    copy of the table as ``--dtype`` stored it; a quantized head (``lm_head_quant_type``) is refused
    beside the flag earlier (``parse_quantization``)."""
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if head is not None and getattr(head, "method", None) is None and hasattr(head, "pinned"):
        head.dtype, head.pinned = "float32", True


def _size(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB else f"{num_bytes / (1 << 20):.1f} MiB"


def _describe_bytes(model: Any) -> str:
    """``"1.23 GiB (bfloat16 1.20 GiB, float32 30.0 MiB)"``: resident bytes by storage dtype."""
    by_dtype = weight_bytes_by_dtype(model)
    total = sum(by_dtype.values())
    parts = ", ".join(f"{k} {_size(v)}" for k, v in sorted(by_dtype.items(), key=lambda kv: -kv[1]))
    return f"{_size(total)} ({parts})" if parts else "(bytes not reported by the model)"


def _log_quantized(model: Any, quantization: Any) -> None:
    """One line with the resident weight memory achieved; one for wint4 layers
    that fell back to per-channel scales."""
    params = model.parameters()
    quantized = [p for p in params.values() if isinstance(p.data, QuantizedWeight)]
    logger.info("weights: %s fp32 -> %s %s (the quantized layers: %s -> %s)",
                _size(weight_bytes(model, as_fp32=True)), _size(weight_bytes(model)), quantization.describe(),
                _size(sum(p.numel * 4 for p in quantized)), _size(sum(resident_bytes(p.data) for p in quantized)))
    per_channel = [name for name, p in params.items()
                   if getattr(p, "method", None) == "wint4" and p.group_size != -1 and p.in_features % p.group_size]
    if per_channel:
        logger.info("wint4: %d weight(s) whose in_features is not a multiple of group size %d use "
                    "per-channel scales (%s)", len(per_channel), quantization.group_size,
                    ", ".join(per_channel[:4]) + (", ..." if len(per_channel) > 4 else ""))


def _offline_quantization(model_dir: Path, quantization: Any) -> Any:
    """The checkpoint's own ``QuantizationConfig`` when ``config.json`` declares
    an offline-quantized checkpoint (``fd_core.quantization.offline``), else
    None. ``quantization`` given without that format is refused naming both."""
    if quantization is not None and getattr(quantization, "offline", None) is not None:
        return quantization
    path = model_dir / "config.json"
    offline = read_offline(json.loads(path.read_text())) if path.is_file() else None
    if offline is None:
        return None
    if quantization is not None:
        raise ValueError(f"--quantization {quantization.describe()} conflicts with the checkpoint in {model_dir}, "
                         f"an {offline.describe()}; drop --quantization: the stored format is used as is")
    return checkpoint_quantization(model_dir, None)


def _check_offline(model: Any, config: ModelConfig) -> None:
    if not getattr(model, "quantizable", False):
        raise UnsupportedFeatureError(f"offline-quantized checkpoint: {config.architecture} does not support "
                                      "quantized weights")


def load_model(model_dir: str | Path, ops: Any, max_position: int | None = None,
               config: ModelConfig | None = None, quantization: Any = None, dtype: str = "float32",
               transform: Any = None, lm_head_fp32: bool = False) -> Any:
    """Build the model named by ``model_dir/config.json`` and load its weights,
    quantized as ``quantization`` (a ``fd_core.quantization.QuantizationConfig``
    or None) says, the others stored in ``dtype`` (float32, float16 or
    bfloat16; ``fd_core.model_loader.dtypes`` resolves ``--dtype auto``).
    ``transform`` (e.g. ``fd_core.parallel.tensor_parallel.TensorParallel``)
    rewrites the built model before quantization (``apply(model)``) and its
    checkpoint targets (``shard_targets(model, targets)``). The LM head is
    stored like the other float weights (``dtype``), as FastDeploy keeps it in
    the model's dtype; ``lm_head_fp32`` (``--lm_head-fp32``) keeps it fp32."""
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {dtype!r}")
    start = time.perf_counter()
    model_dir = Path(model_dir)
    config = config or load_config(model_dir)
    model_cls = registry.resolve(config.architecture)
    if dtype not in supported_weight_dtypes(model_cls):
        raise UnsupportedFeatureError(
            f"--dtype {dtype}: {config.architecture} takes weights in "
            f"{', '.join(supported_weight_dtypes(model_cls))} only; use --dtype float32 (or auto)")
    model = model_cls(config, ops, max_position)
    offline = _offline_quantization(model_dir, quantization)
    if offline is not None:
        quantization = offline
        _check_offline(model, config)
    if transform is not None:
        transform.apply(model)
    if offline is not None:  # on the rank's shapes: each rank reads its slice of the stored tensors
        install_prequantized(model, offline.offline)
    if quantization is not None and offline is None:
        if not getattr(model, "quantizable", False):
            raise UnsupportedFeatureError(
                f"--quantization {quantization.method}: {config.architecture} does not support "
                "quantization; run it without --quantization"
            )
        quantization = quantization.for_architecture(config.architecture)
        quantize_model(model, quantization)
    _use_dtype(model, dtype)
    if lm_head_fp32:
        _keep_lm_head_fp32(model)
    files = checkpoint_files(model_dir)
    readers = []
    try:
        readers = [SafetensorsFile(f) for f in files]
    except SafetensorsError as exc:
        raise CheckpointError(str(exc)) from None
    all_names = [n for r in readers for n in r.keys()]
    naming = _detect_naming(all_names)
    targets = model.checkpoint_targets(naming)
    if transform is not None:
        targets = transform.shard_targets(model, targets)
    if offline is not None:
        if naming != "paddle":
            raise CheckpointError(f"{model_dir}: an offline-quantized checkpoint in {naming} naming; fd-core "
                                  "reads FastDeploy's Paddle-named ones (ernie.*)")
        targets = prequantized_targets(model, targets, offline.offline, config.num_kv_heads * config.head_dim,
                                       transform)
    seen: set[str] = set()
    unexpected: list[str] = []
    for reader in readers:
        for name in reader.keys():
            if name not in targets:
                if not (_IGNORED.search(name) or (name == "lm_head.weight" and config.tie_word_embeddings)):
                    unexpected.append(name)
                continue
            if name in seen:
                raise CheckpointError(f"tensor {name!r} appears in more than one shard")
            seen.add(name)
            # the raw view (no copy); integer tensors pass through cast_host as numbers
            array, src = reader.get_raw(name), reader.float_dtype(name) or reader.dtype(name)
            for target in targets[name]:
                _place(target, name, array, src)
                if target.param.complete and target.param.data is None:
                    target.param.finish()
            del array
            reader.release(name)  # its mapped pages leave RssFile: one tensor mapped at a time
        reader.close()
    missing = [n for n in targets if n not in seen]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(
            f"checkpoint in {model_dir} ({naming} naming) is missing tensor(s) "
            f"{', '.join(repr(m) for m in missing[:5])}{more} required by its config.json"
        )
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise CheckpointError(
            f"checkpoint in {model_dir} has tensor(s) {', '.join(repr(u) for u in unexpected[:5])}"
            f"{more} that {config.architecture} with this config.json does not use"
        )
    for name, param in model.parameters().items():
        if param.data is None:
            raise CheckpointError(f"parameter {name} was only partly filled by the checkpoint")
    model.finish_loading()
    logger.info("loaded %s (%s naming, %d tensors) in %.1f s; weights %s", model_dir, naming, len(seen),
                time.perf_counter() - start, _describe_bytes(model))
    if quantization is not None:
        _log_quantized(model, quantization)
    if offline is not None and offline.offline.static_kv_scales and offline.offline.kv_cache_dtype != "int8":
        logger.info("%s: its static per-channel %s KV-cache scales are loaded but not applied: fd-core's %s KV "
                    "cache scales each token and KV head on the fly (int8's are applied: int8_static)",
                    model_dir, offline.offline.kv_cache_quant_type, offline.offline.kv_cache_dtype)
    return model
