"""Finding a model directory: a local path, or a hub id in the local cache."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ModelNotFoundError", "resolve_model_path"]


class ModelNotFoundError(FileNotFoundError):
    """Neither a local directory nor a cached (or downloadable) hub model."""


def resolve_model_path(model: str) -> Path:
    """Return the directory holding ``model``'s config.json and weights.

    Local directories come first. Anything else is a hub id looked up in the
    Hugging Face cache; if it is not cached, a download is attempted unless
    offline mode (``HF_HUB_OFFLINE=1``) is on, and the error says which.
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
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError:
        raise ModelNotFoundError(
            f"model {model!r} is not a local directory, and huggingface_hub (needed to look up "
            "hub ids) is not installed: pip install huggingface_hub, or pass a local path"
        ) from None
    try:
        return Path(huggingface_hub.snapshot_download(model, local_files_only=True))
    except Exception:
        pass
    if constants.HF_HUB_OFFLINE:
        raise ModelNotFoundError(
            f"model {model!r} is not in the local hub cache ({constants.HF_HUB_CACHE}) and "
            "HF_HUB_OFFLINE is set, so it cannot be downloaded; download it where there is "
            "network (huggingface-cli download MODEL) or pass a local directory"
        )
    try:
        return Path(huggingface_hub.snapshot_download(model, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]))
    except Exception as exc:
        raise ModelNotFoundError(
            f"model {model!r} is not in the local hub cache ({constants.HF_HUB_CACHE}) and "
            f"downloading it failed: {type(exc).__name__}: {exc}"
        ) from None
