"""Parser registries: spellings, errors, plugins; the package stays pure Python."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from fd_core.parsers import ReasoningParser, ReasoningParserManager, ToolParser, ToolParserManager
from fd_core.parsers import registry as registry_module
from fd_core.parsers.reasoning_ernie45_vl import Ernie45VLReasoningParser
from fd_core.parsers.reasoning_ernie_x1 import ErnieX1ReasoningParser
from fd_core.parsers.reasoning_qwen3 import Qwen3ReasoningParser
from fd_core.parsers.tool_ernie_x1 import ErnieX1ToolParser
from fd_core.plugins import hookimpl


@pytest.mark.parametrize("name, cls", [
    ("ernie_x1", ErnieX1ReasoningParser), ("ernie-x1", ErnieX1ReasoningParser),
    ("ernie-45-vl", Ernie45VLReasoningParser), ("ernie_45_vl", Ernie45VLReasoningParser),
    ("qwen3", Qwen3ReasoningParser), ("Qwen3", Qwen3ReasoningParser),
])
def test_reasoning_names(name, cls):
    assert ReasoningParserManager.get(name) is cls
    assert issubclass(cls, ReasoningParser) and name in ReasoningParserManager


def test_tool_names():
    assert ToolParserManager.get("ernie_x1") is ToolParserManager.get("ernie-x1") is ErnieX1ToolParser
    assert issubclass(ErnieX1ToolParser, ToolParser)
    assert {"ernie_x1", "ernie-45-vl", "qwen3"} <= set(ReasoningParserManager.names())
    assert "ernie_x1" in ToolParserManager.names()


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(ValueError, match=r"unknown reasoning parser 'deepseek_r1'; available: .*ernie_x1"):
        ReasoningParserManager.get("deepseek_r1")
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'hermes'; available: .*ernie_x1"):
        ToolParserManager.get("hermes")


@pytest.fixture
def fresh_registries(monkeypatch):
    """Registries with their built-ins only and plugins not yet loaded."""
    for manager in (ReasoningParserManager, ToolParserManager):
        monkeypatch.setattr(manager, "_entries", dict(manager._entries))
    monkeypatch.setattr(registry_module, "_plugins_loaded", False)


class EchoReasoning(ErnieX1ReasoningParser):
    pass


def test_register_and_decorator(fresh_registries):
    ReasoningParserManager.register("my-parser", EchoReasoning)
    assert ReasoningParserManager.get("my_parser") is EchoReasoning

    @ToolParserManager.register_module("my_tools")
    class MyTools(ErnieX1ToolParser):
        pass

    assert ToolParserManager.get("my-tools") is MyTools
    with pytest.raises(ValueError, match="non-empty name"):
        ToolParserManager.register(" ", MyTools)


def test_plugins_register_parsers_once(fresh_registries, monkeypatch):
    from fd_core.plugins import manager

    calls = []
    plugin = types.ModuleType("fake_parser_plugin")

    @hookimpl
    def fd_register_parsers(reasoning, tool_call):
        calls.append(1)
        reasoning.register("echo", EchoReasoning)
        tool_call.register("echo-tools", ErnieX1ToolParser)

    plugin.fd_register_parsers = fd_register_parsers
    monkeypatch.setattr(manager, "load_general_plugins", lambda: [plugin])
    assert ReasoningParserManager.get("echo") is EchoReasoning
    assert "echo_tools" in ToolParserManager and "echo-tools" in ToolParserManager.names()
    ToolParserManager.get("echo_tools")
    assert calls == [1]


def test_importing_and_using_parsers_needs_no_paddle_or_numpy():
    code = (
        "import sys\n"
        "from fd_core.parsers import ReasoningParserManager as R, ToolParserManager as T\n"
        "for n in R.names(): R.get(n)(None).extract_reasoning_content('a</think>b')\n"
        "T.get('ernie_x1')(None).extract_tool_calls('<tool_call>{\"name\": \"f\"}</tool_call>')\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('paddle', 'numpy', 'torch'))\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)  # general plugins load too
