"""A test-only model that answers with a fixed script, for end-to-end parser tests.

Random-weight checkpoints never write ``<think>`` or ``<tool_call>``; this
model does, deterministically. ``make_checkpoint(path, script)`` writes a
checkpoint (the generated tiny checkpoint's tokenizer, a config.json naming
``FdScriptedForCausalLM``, and a safetensors file holding the script's token
ids); with this distribution installed (entry point ``scripted`` in
``fd_core.plugins``), ``fd_core.LLM(path, backend="cpu")`` loads it and
every request's answer is the script, then ``<|end_of_sentence|>``.

Importing this package is cheap (no paddle, no numpy): the entry point is
loaded in every process that loads general plugins, API server included.
"""

from __future__ import annotations

from fd_scripted_model.checkpoint import ARCHITECTURE, make_checkpoint

__all__ = ["ARCHITECTURE", "make_checkpoint"]
