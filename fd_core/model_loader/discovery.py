"""Finding a model directory: a local path, or a hub id in a local cache.

A hub id (``owner/name``) is looked up, in order, in:

1. ``FD_MODEL_CACHE/<owner>/<name>`` (FastDeploy's download layout; without
   FD_MODEL_CACHE, FastDeploy downloads to ``~/<owner>/<name>``, looked at too);
2. the Hugging Face hub cache (``FD_MODEL_CACHE`` when set, else
   ``HF_HUB_CACHE``), offline first;
3. a download from the Hugging Face hub, unless ``HF_HUB_OFFLINE=1``: into
   ``FD_MODEL_CACHE/<owner>/<name>`` when set, else the hub cache.

``FD_MODEL_SOURCE`` names the hub: ``HUGGINGFACE`` (also what unset means
here). FastDeploy's ``AISTUDIO`` and ``MODELSCOPE`` are refused by name: no
client for them is built in. Local directories never depend on it.
"""

from __future__ import annotations

from pathlib import Path

from fd_core import envs

__all__ = ["ModelNotFoundError", "resolve_model_path"]

_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]


class ModelNotFoundError(FileNotFoundError):
    """Neither a local directory nor a cached (or downloadable) hub model."""


def _model_dir(path: Path) -> Path | None:
    return path if (path / "config.json").is_file() else None


def _fastdeploy_layout(model: str, cache: str | None) -> Path | None:
    """``<cache>/<owner>/<name>`` as FastDeploy downloads (baidu/ and PaddlePaddle/
    name the same models on different hubs)."""
    root = Path(cache).expanduser() if cache else Path.home()
    owner, name = model.split("/")
    owners = [owner]
    if owner.lower() == "baidu":
        owners.append("PaddlePaddle")
    elif owner.lower() == "paddlepaddle":
        owners.append("baidu")
    for candidate in owners:
        found = _model_dir(root / candidate / name)
        if found is not None:
            return found
    return None


def resolve_model_path(model: str, revision: str | None = None) -> Path:
    """Return the directory holding ``model``'s config.json and weights.

    Local directories come first; anything else is a hub id looked up as the
    module docstring says. ``revision`` (a branch, tag or commit) selects the
    hub snapshot. Raises ModelNotFoundError saying where it looked and what to
    do, ValueError for an FD_MODEL_SOURCE this build cannot use.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory but has no config.json")
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ModelNotFoundError(
            f"model {model!r} is not a model directory and does not look like a hub id (owner/name)"
        )
    source = envs.get("FD_MODEL_SOURCE") or "HUGGINGFACE"
    if source != "HUGGINGFACE":
        raise ValueError(
            f"FD_MODEL_SOURCE={source}: downloading from {source} is not implemented here; set "
            f"FD_MODEL_SOURCE=HUGGINGFACE, or download {model} yourself and pass its directory"
        )
    cache = envs.get("FD_MODEL_CACHE")
    if revision is None:
        found = _fastdeploy_layout(model, cache)
        if found is not None:
            return found
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError:
        raise ModelNotFoundError(
            f"model {model!r} is not a local directory, and huggingface_hub (needed to look up "
            "hub ids) is not installed: pip install huggingface_hub, or pass a local path"
        ) from None
    hub_cache = str(Path(cache).expanduser()) if cache else constants.HF_HUB_CACHE
    try:
        return Path(huggingface_hub.snapshot_download(
            model, revision=revision, cache_dir=hub_cache, local_files_only=True))
    except Exception:
        pass
    where = f"FD_MODEL_CACHE {cache}" if cache else f"the local hub cache ({hub_cache})"
    if constants.HF_HUB_OFFLINE:
        raise ModelNotFoundError(
            f"model {model!r} is not in {where} and HF_HUB_OFFLINE is set, so it cannot be "
            "downloaded; download it where there is network (huggingface-cli download MODEL) "
            "or pass a local directory"
        )
    try:
        if cache:
            target = Path(cache).expanduser() / model
            return Path(huggingface_hub.snapshot_download(
                model, revision=revision, local_dir=str(target), allow_patterns=_PATTERNS))
        return Path(huggingface_hub.snapshot_download(
            model, revision=revision, cache_dir=hub_cache, allow_patterns=_PATTERNS))
    except Exception as exc:
        raise ModelNotFoundError(
            f"model {model!r} is not in {where} and downloading it failed: "
            f"{type(exc).__name__}: {exc}"
        ) from None
