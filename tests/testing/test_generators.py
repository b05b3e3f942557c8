"""Checkpoint generators by shape: built-in families and a model plugin's
(``fd_register_checkpoint_generators``; the scripted model in
tests/plugins/fd_scripted_model registers ``scripted-hello``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fd_core.testing.checkpoints import generate_checkpoint
from fd_core.testing.generators import GeneratorRegistry, generators


def test_builtin_shapes_of_both_families_are_registered() -> None:
    shapes = generators.shapes()
    assert {"tiny-dense", "tiny-moe", "tiny-qwen3"} <= set(shapes)


def test_an_unknown_shape_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown checkpoint shape 'nope'.*tiny-dense"):
        generate_checkpoint(tmp_path, "nope")


def test_a_registered_generator_is_called_with_the_arguments(tmp_path: Path) -> None:
    calls = []
    registry = GeneratorRegistry()

    def fake(path: Path, shape: str, **kwargs: object) -> Path:
        calls.append((shape, kwargs))
        return Path(path)

    registry.register("mine", fake)
    assert registry.generate(tmp_path, "mine", naming="paddle", seed=3) == tmp_path
    assert calls == [("mine", {"naming": "paddle", "seed": 3})]
    with pytest.raises(ValueError, match="non-empty name"):
        registry.register("", fake)


def test_a_model_plugin_brings_its_generator(tmp_path: Path) -> None:
    pytest.importorskip("fd_scripted_model", reason="pip install -e tests/plugins/fd_scripted_model")
    assert "scripted-hello" in generators.shapes()
    out = generate_checkpoint(tmp_path / "s", "scripted-hello")
    config = json.loads((out / "config.json").read_text())
    from fd_scripted_model.checkpoint import ARCHITECTURE

    assert config["architectures"] == [ARCHITECTURE]
    # and through the command line, which lists the plugin's shape among its choices
    cli = subprocess.run([sys.executable, "-m", "fd_core.testing.checkpoints", "--shape", "scripted-hello",
                          "--out", str(tmp_path / "cli")], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert (tmp_path / "cli" / "config.json").exists()


def test_the_plugin_generated_checkpoint_serves(tmp_path: Path) -> None:
    pytest.importorskip("fd_scripted_model", reason="pip install -e tests/plugins/fd_scripted_model")
    from fd_core import LLM, SamplingParams

    out = generate_checkpoint(tmp_path / "s", "scripted-hello")
    llm = LLM(str(out), backend="cpu", num_gpu_blocks_override=32, max_model_len=256, block_size=16)
    result = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=16))
    assert result[0].outputs.text == "Hello from a plugin."


def test_a_generator_that_cannot_be_loaded_is_named(tmp_path: Path) -> None:
    registry = GeneratorRegistry()
    registry.register("broken", "no_such_module_here:generate")
    registry.register("malformed", "nocolon")
    with pytest.raises(ValueError, match="shape 'broken'.*no_such_module_here"):
        registry.generate(tmp_path, "broken")
    with pytest.raises(ValueError, match="shape 'malformed'.*module:function"):
        registry.generate(tmp_path, "malformed")
