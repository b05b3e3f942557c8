"""Writing a scripted checkpoint."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["ARCHITECTURE", "make_checkpoint"]

ARCHITECTURE = "FdScriptedForCausalLM"
# Tensors: the script's ids then the end token, and the marker's ids, each
# padded with -1 to max_position_embeddings entries (the model's parameter
# shapes come from config.json alone).
SCRIPT_TENSOR = "model.script"
MARKER_TENSOR = "model.marker"


def make_checkpoint(path: str | Path, script: str, marker: str = "Assistant: ") -> Path:
    """Write a checkpoint whose model answers ``script`` after the last
    ``marker`` in a sequence (by default the end of ERNIE's chat prompt).

    The marker is matched as the token ids ``encode(marker)``, which must be
    how it is tokenized in the prompt too ("Assistant: " is, after ERNIE's
    "\n"). Raises ValueError when the script does not survive encode/decode
    with the generated tokenizer (the output text could then not equal it),
    e.g. because it holds a special token, or does not fit the model's
    positions.
    """
    import numpy as np
    from safetensors.numpy import save_file

    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.tokenizer import Tokenizer
    from fd_core.tokenizer.special_tokens import SEP_TOKEN

    if not marker:
        raise ValueError("marker must be a non-empty string")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = generate_checkpoint(Path(tmp) / "tiny", "tiny-dense", num_hidden_layers=1)
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
        for item in source.iterdir():
            if item.name != "config.json" and not item.name.endswith(".safetensors"):
                shutil.copy(item, out / item.name)
    tokenizer = Tokenizer.from_pretrained(out)
    script_ids = tokenizer.encode(script)
    shown = tokenizer.decode(script_ids, skip_special_tokens=True)  # as the output text shows it
    if shown != script:
        raise ValueError(
            f"script {script!r} does not round-trip through the tokenizer (the output would read "
            f"{shown!r}); leave out special tokens such as <|end_of_sentence|>"
        )
    marker_ids = tokenizer.encode(marker)
    end_id = tokenizer.added_tokens[SEP_TOKEN]
    capacity = int(config["max_position_embeddings"])
    if len(script_ids) + 1 > capacity or len(marker_ids) > capacity:
        raise ValueError(f"script or marker longer than {capacity - 1} tokens")

    def padded(ids: list[int]) -> np.ndarray:
        values = np.full([capacity], -1.0, dtype=np.float32)
        values[: len(ids)] = ids
        return values

    config.pop("fd_generated", None)
    config.update(
        architectures=[ARCHITECTURE],
        num_hidden_layers=1,
        fd_script=script,
        fd_marker=marker,
        fd_note="scripted test model (fd_scripted_model): answers fd_script, not a trained model",
    )
    (out / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    save_file(
        {SCRIPT_TENSOR: padded([*script_ids, end_id]), MARKER_TENSOR: padded(marker_ids)},
        str(out / "model.safetensors"),
    )
    return out


def generate(path: str | Path, shape: str, naming: str = "pytorch", seed: int = 0, dtype: str = "bfloat16",
             shards: int = 1, **overrides: Any) -> Path:
    """The plugin's checkpoint generator (``fd_register_checkpoint_generators``):
    shape ``scripted-hello`` answers "Hello from a plugin." to any chat prompt.
    The scripted model has no weights to draw, so seed and dtype change nothing;
    it has one naming and one file."""
    if shape != "scripted-hello":
        raise ValueError(f"unknown scripted-model shape {shape!r}; expected 'scripted-hello'")
    if shards != 1 or overrides:
        raise ValueError(f"the scripted model takes no shards or config overrides, got shards={shards}, "
                         f"{sorted(overrides)}")
    return make_checkpoint(path, "Hello from a plugin.")
