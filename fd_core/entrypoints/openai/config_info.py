"""What ``GET /config-info`` answers: the effective configuration, secrets masked.

``config_info(engine_args, server_kwargs)`` is built once by whoever starts
the server (it knows the parsed flags) and stored as ``app.state.config_info``;
the route adds what only the running engine knows (``EngineInfo``: the
backend ``auto`` chose, the KV block count) at request time. Without it the
route answers from ``app.state.fd`` alone (``fallback_config_info``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import fd_core
from fd_core import envs
from fd_core.masking import mask_secrets

__all__ = ["config_info", "fallback_config_info", "model_config_summary"]

# config.json keys worth showing (Hugging Face and ERNIE names)
_MODEL_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
               "max_position_embeddings", "rope_theta", "torch_dtype", "dtype", "tie_word_embeddings",
               "moe_num_experts", "moe_k", "num_experts", "num_experts_per_tok", "quantization_config")


def _plain(value: Any) -> Any:
    """JSON-safe copy: dataclasses and mappings to dicts, sequences to lists, the rest to str."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def model_config_summary(model_dir: str | Path | None) -> dict[str, Any] | None:
    """The main fields of ``model_dir/config.json``; None when there is none to read."""
    if not model_dir:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    return {k: _plain(config[k]) for k in _MODEL_KEYS if k in config}


def config_info(engine_args: Any, server_kwargs: dict[str, Any] | None = None,
                model_dir: str | Path | None = None) -> dict[str, Any]:
    """The effective configuration for /config-info (JSON-safe, secrets masked).

    ``engine_args`` is the ``EngineArgs`` the engine was built with,
    ``server_kwargs`` the keyword arguments of ``ServerArgs`` (plus any server
    flag worth showing: host, port, workers...), ``model_dir`` the resolved
    model directory when known (its config.json is summarised). Every value
    whose name says key/password/secret/token, and credentials in URLs,
    become "***"; the FD_* environment is included, masked the same way.
    """
    engine = mask_secrets(_plain(engine_args))
    return {
        "version": fd_core.__version__,
        "model": engine.get("model") if isinstance(engine, dict) else None,
        "backend": engine.get("backend") if isinstance(engine, dict) else None,
        "engine_args": engine,
        "server_args": mask_secrets(_plain(server_kwargs or {})),
        "model_config": model_config_summary(model_dir),
        "environment": envs.environment(),
    }


def fallback_config_info(state: Any) -> dict[str, Any]:
    """What the app alone knows (``app.state.fd``), for apps built without ``config_info``."""
    info = state.client.info
    return {
        "version": fd_core.__version__,
        "model": info.model_dir,
        "backend": info.backend,
        "served_model_names": list(state.served_model_names),
        "max_model_len": state.max_model_len,
        "model_config": model_config_summary(info.model_dir),
        "environment": envs.environment(),
    }
