"""The plugin module the ``fd_core.plugins`` entry point names."""

from __future__ import annotations

from typing import Any

from fd_core.plugins import API_VERSION, hookimpl
from fd_scripted_model.checkpoint import ARCHITECTURE

FD_API_VERSION = API_VERSION


@hookimpl
def fd_register_models(registry: Any) -> None:
    # "module:attr": the model module imports paddle, so it loads only when
    # a checkpoint naming this architecture is opened.
    registry.register(ARCHITECTURE, "fd_scripted_model.model:ScriptedModel")


@hookimpl
def fd_register_checkpoint_generators(registry: Any) -> None:
    registry.register("scripted-hello", "fd_scripted_model.checkpoint:generate")
