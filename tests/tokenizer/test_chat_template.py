"""Chat template: ERNIE's format, equal to HF's apply_chat_template byte for byte, overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest

from fd_core.tokenizer import ChatTemplate, Tokenizer, load_chat_template
from fd_core.tokenizer.chat_template import ERNIE_CHAT_TEMPLATE, TemplateLimitError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "查询天气",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "single": ([{"role": "user", "content": "hi"}], {}),
    "system_multi_turn": (
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "你好"},
            {"role": "assistant", "content": "你好！有什么可以帮你？"},
            {"role": "user", "content": "Tell me a joke 😀"},
        ],
        {},
    ),
    "list_content": (
        [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "part one, "},
                    {"type": "text", "text": "part two"},
                ],
            },
        ],
        {},
    ),
    "tools": (
        [
            {"role": "system", "content": "Use tools when needed."},
            {"role": "user", "content": "北京天气？"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "I should call the tool.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "北京"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "晴，25°C"},
        ],
        {"tools": TOOLS},
    ),
    "tool_call_dict_args": (
        [
            {"role": "user", "content": "weather in Paris"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "content": "rain"},
            {"role": "assistant", "content": "It rains.", "reasoning": "tool said rain"},
            {"role": "user", "content": "thanks"},
        ],
        {"tools": TOOLS},
    ),
    "thinking_off": ([{"role": "user", "content": "2+2?"}], {"enable_thinking": False}),
    "thinking_on": ([{"role": "user", "content": "2+2?"}], {"enable_thinking": True}),
}


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_equals_hf(tok: Tokenizer, hf_tok, name: str, add_generation_prompt: bool) -> None:  # noqa: ANN001
    messages, kwargs = CONVERSATIONS[name]
    ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
    theirs = hf_tok.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )
    assert ours == theirs
    ids = tok.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, **kwargs
    )
    assert ids == hf_tok.encode(theirs, add_special_tokens=False)


def test_ernie_format(tok: Tokenizer) -> None:
    messages, _ = CONVERSATIONS["system_multi_turn"]
    assert tok.apply_chat_template(messages) == (
        "<|begin_of_sentence|>You are a helpful assistant.\nUser: 你好\n"
        "Assistant: 你好！有什么可以帮你？<|end_of_sentence|>User: Tell me a joke 😀\nAssistant: "
    )
    ids = tok.apply_chat_template(messages, tokenize=True)
    assert ids[0] == tok.convert_tokens_to_ids("<|begin_of_sentence|>")
    assert tok.convert_tokens_to_ids("<|end_of_sentence|>") in ids


def test_enable_thinking_false_prefills_empty_think(tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "2+2?"}]
    off = tok.apply_chat_template(messages, enable_thinking=False)
    assert off.endswith("Assistant: <think>\n\n</think>\n\n")
    assert tok.apply_chat_template(messages).endswith("Assistant: ")


def test_tools_and_tool_calls_rendered(tok: Tokenizer) -> None:
    messages, kwargs = CONVERSATIONS["tools"]
    text = tok.apply_chat_template(messages, **kwargs)
    assert '"name": "get_weather"' in text and "<tool_list>" in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "北京"}}\n</tool_call>' in text
    )
    assert "<think>\nI should call the tool.\n</think>" in text
    assert "<tool_output>\n晴，25°C\n</tool_output>\n" in text


def test_override_by_string_and_file(tiny_dir: Path, tmp_path: Path) -> None:
    source = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    path = tmp_path / "custom.jinja"
    path.write_text(source)
    messages = [{"role": "user", "content": "x"}]
    assert (
        Tokenizer.from_pretrained(tiny_dir, chat_template=path).apply_chat_template(messages)
        == "[user]x"
    )
    assert (
        Tokenizer.from_pretrained(tiny_dir, chat_template=source).apply_chat_template(messages)
        == "[user]x"
    )
    tok = Tokenizer.from_pretrained(tiny_dir)
    assert tok.apply_chat_template(messages, chat_template=str(path)) == "[user]x"


def test_bad_inputs_raise(tok: Tokenizer) -> None:
    with pytest.raises(jinja2.TemplateError, match="Unknown message role"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="empty conversation"):
        tok.apply_chat_template([])
    with pytest.raises(ValueError, match="neither a readable file"):
        load_chat_template("/no/such/template.jinja")


def test_sandbox_blocks_python_internals() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        template.render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_restricted_renders_real_templates_the_same(tok: Tokenizer, name: str) -> None:
    messages, kwargs = CONVERSATIONS[name]
    trusted = ChatTemplate(ERNIE_CHAT_TEMPLATE, tok.special_tokens)
    restricted = ChatTemplate(ERNIE_CHAT_TEMPLATE, tok.special_tokens, restricted=True)
    assert restricted.render(messages, **kwargs) == trusted.render(messages, **kwargs)


@pytest.mark.parametrize(
    "source,words",
    [
        ("{{ 'a' * 10**10 }}", ["'*'", "str of 10000000000 items"]),
        ("{{ 10**10 * 'a' }}", ["'*'", "str of 10000000000"]),
        ("{{ [0] * 2000000 }}", ["list of 2000000 items"]),
        ("{{ 7 ** 1000000000 }}", ["'**'", "exponent 1000000000"]),
        ("{% set n = 2 ** 90000 %}{{ (n * n) > 0 }}", ["'*'", "int of about"]),
        ("{% for i in range(20000) %}{% endfor %}", ["range(20000) has 20000 items"]),
        ("{% for i in range(9000) %}{{ 'x' * 1000 }}{% endfor %}", ["longer than 8388608 characters"]),
    ],
)
def test_restricted_refuses_huge_results(source: str, words: list[str]) -> None:
    template = ChatTemplate(source, restricted=True)
    with pytest.raises(TemplateLimitError) as info:
        template.render([{"role": "user", "content": "x"}])
    assert all(w in str(info.value) for w in words), str(info.value)
    assert isinstance(info.value, jinja2.exceptions.SecurityError)


def test_restricted_allows_small_results_and_trusted_keeps_jinja_limits() -> None:
    user = [{"role": "user", "content": "x"}]
    small = "{{ 'ab' * 3 }}|{{ 3 * [1] | length }}|{{ 2 ** 10 }}|{{ range(3) | list | length }}"
    assert ChatTemplate(small, restricted=True).render(user) == "ababab|3|1024|3"
    # a server's (trusted) template keeps jinja's sandbox limits: range up to 100000, no `*` check
    trusted = ChatTemplate("{{ range(20000) | list | length }} {{ ('a' * 2000000) | length }}")
    assert trusted.render(user) == "20000 2000000"
