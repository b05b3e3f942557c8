"""The tokenizer.json (byte-level BPE) tokenizer on a generated Qwen3 checkpoint: ids, text and
chat prompts equal HF transformers', and it offers what the engine and server use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fd_core.testing.qwen3_checkpoint import generate_qwen3_checkpoint
from fd_core.tokenizer import HFTokenizer, IncrementalDetokenizer, SentencePieceTokenizer, Tokenizer

TEXTS = [
    "Hello world, it's 2025!",
    "  leading spaces\tand tabs\n\nnew lines\r\n",
    "你好，世界。混合 text with 数字 12345 and emoji 🙂👍🏽",
    "<|im_start|>user\nhi<|im_end|>\n<think>\nplan\n</think>\n\nanswer",
    "def f(x):\n    return {'a': [x ** 2]}  # café",
    "",
]
CONVERSATIONS = [
    [{"role": "user", "content": "Name a prime."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "<think>\nsay hi\n</think>\n\nhello"}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": "weather?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "20C"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-tok"))


@pytest.fixture(scope="module")
def tok(qwen_dir: Path) -> HFTokenizer:
    loaded = Tokenizer.from_pretrained(qwen_dir)
    assert isinstance(loaded, HFTokenizer)
    return loaded


@pytest.fixture(scope="module")
def hf(qwen_dir: Path):  # noqa: ANN201
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(qwen_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_equal_hf(tok: HFTokenizer, hf, text: str) -> None:  # noqa: ANN001
    ids = tok.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == hf.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one", "thinking-history", "tools"])
@pytest.mark.parametrize("thinking", [None, False, True])
def test_chat_template_renders_as_hf(tok: HFTokenizer, hf, conversation, thinking) -> None:  # noqa: ANN001
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    tools = TOOLS if conversation is CONVERSATIONS[2] else None
    ours = tok.apply_chat_template(conversation, add_generation_prompt=True, tools=tools, **kwargs)
    assert isinstance(ours, str)
    assert ours == hf.apply_chat_template(conversation, add_generation_prompt=True, tools=tools, tokenize=False,
                                          **kwargs)
    assert ours.endswith("<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if thinking is False else ""))
    ids = tok.apply_chat_template(conversation, tokenize=True, tools=tools, **kwargs)
    assert ids == hf.encode(ours, add_special_tokens=False)
    assert tok.added_tokens["<|im_start|>"] in ids


def test_special_and_added_tokens(tok: HFTokenizer) -> None:
    added = tok.added_tokens
    end, im_end, think_end = added["<|endoftext|>"], added["<|im_end|>"], added["</think>"]
    assert tok.eos_token_ids == [im_end, end]  # generation_config.json
    assert tok.eos_token_id == im_end and tok.pad_token_id == end and tok.bos_token_id is None
    assert {end, im_end, added["<|im_start|>"]} <= set(tok.all_special_ids)
    assert think_end not in tok.all_special_ids  # <think>/</think> are added, not special: they stay in text
    assert tok.decode([think_end, im_end], skip_special_tokens=True) == "</think>"
    assert tok.convert_ids_to_tokens(im_end) == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") == im_end
    assert tok.convert_tokens_to_ids("\n") is None  # byte-level spells it "Ċ"
    newline = tok.convert_tokens_to_ids("Ċ")
    assert isinstance(newline, int) and tok.convert_ids_to_tokens(newline) == "Ċ"
    assert len(tok) == tok.vocab_size == 2048 == max(added.values()) + 1
    assert tok.strips_leading_space is False
    assert tok.max_token_bytes == max(len(tok.token_bytes(i)) for i in range(len(tok)))


def test_split_special_tokens_keeps_added_strings_as_text(tok: HFTokenizer) -> None:
    text = "<|im_end|> and <think> stay text"
    ids = tok.encode(text, split_special_tokens=True)
    assert set(ids).isdisjoint(tok.added_tokens.values())
    assert tok.decode(ids) == text
    plain = "no added tokens here, 你好"
    assert tok.encode(plain, split_special_tokens=True) == tok.encode(plain)


def test_lone_surrogate_is_a_value_error(tok: HFTokenizer) -> None:
    with pytest.raises(ValueError, match="lone surrogate"):
        tok.encode("bad \ud800 text")


def test_ids_past_the_vocabulary_decode_to_nothing(tok: HFTokenizer) -> None:
    # a checkpoint pads its embedding past the tokenizer (Qwen3: 151936 rows for 151669 tokens)
    assert tok.token_bytes(len(tok) + 5) == b""
    with pytest.raises(ValueError, match="out of range"):
        tok.convert_ids_to_tokens(len(tok))


@pytest.mark.parametrize("skip", [False, True])
def test_detokenizer_streams_what_decode_gives(tok: HFTokenizer, skip: bool) -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = [int(i) for i in rng.integers(0, len(tok), 40)]
        detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)  # type: ignore[arg-type]
        text = "".join(detok.add(i) for i in ids) + detok.finish()
        assert text == tok.decode(ids, skip_special_tokens=skip)


def test_multibyte_character_waits_until_complete(tok: HFTokenizer) -> None:
    ids = tok.encode("🙂")
    assert len(ids) > 1  # a rare character is several byte tokens
    detok = IncrementalDetokenizer(tok)  # type: ignore[arg-type]
    assert [detok.add(i) for i in ids] == [""] * (len(ids) - 1) + ["🙂"]


def test_from_pretrained_picks_by_files(qwen_dir: Path, tmp_path: Path, checkpoint_factory) -> None:  # noqa: ANN001
    assert type(Tokenizer.from_pretrained(checkpoint_factory("tiny-dense"))) is Tokenizer  # sentencepiece
    assert issubclass(Tokenizer, SentencePieceTokenizer)
    with pytest.raises(FileNotFoundError, match="tokenizer.model .*tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)
    override = Tokenizer.from_pretrained(qwen_dir, chat_template="{{ messages[0]['content'] }}!")
    assert override.apply_chat_template([{"role": "user", "content": "x"}]) == "x!"


def test_non_byte_level_tokenizer_json_is_refused(qwen_dir: Path, tmp_path: Path) -> None:
    spec = json.loads((qwen_dir / "tokenizer.json").read_text(encoding="utf-8"))
    spec["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match="decoder 'Metaspace'"):
        Tokenizer.from_pretrained(tmp_path)


def test_no_chat_template_is_a_clear_error(qwen_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text((qwen_dir / "tokenizer.json").read_text(encoding="utf-8"),
                                             encoding="utf-8")
    with pytest.raises(ValueError, match="no chat template.*--chat-template"):
        Tokenizer.from_pretrained(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


def test_generated_tokenizer_is_deterministic(tmp_path: Path) -> None:
    from fd_core.testing.qwen3_checkpoint import train_tokenizer

    train_tokenizer.cache_clear()
    first = train_tokenizer()
    train_tokenizer.cache_clear()
    assert train_tokenizer() == first


def test_a_plugin_brings_a_tokenizer_format(qwen_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory with neither tokenizer.model nor tokenizer.json goes to the general plugins'
    ``fd_load_tokenizer`` (entry-point group fd_core.plugins)."""
    import sys

    site = tmp_path / "site"
    info = site / "fd_test_tok_plugin-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fd-test-tok-plugin\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[fd_core.plugins]\ntoktest = fd_test_tok_plugin\n")
    (site / "fd_test_tok_plugin.py").write_text(
        "from fd_core.plugins import API_VERSION, hookimpl\n"
        "from fd_core.tokenizer import HFTokenizer\n"
        "FD_API_VERSION = API_VERSION\n"
        "@hookimpl\n"
        "def fd_load_tokenizer(path, chat_template):\n"
        "    spec = path / 'vocab.toktest.json'\n"
        "    return HFTokenizer(spec.read_text(), {'eos_token': '<|im_end|>'}) if spec.is_file() else None\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("FD_PLUGINS", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "vocab.toktest.json").write_text((qwen_dir / "tokenizer.json").read_text(encoding="utf-8"))
    try:
        loaded = Tokenizer.from_pretrained(model)
        assert isinstance(loaded, HFTokenizer) and loaded.encode("hello") == HFTokenizer.from_pretrained(
            qwen_dir).encode("hello")
        assert loaded.eos_token_ids == [loaded.added_tokens["<|im_end|>"]]
        with pytest.raises(FileNotFoundError, match="no plugin's fd_load_tokenizer"):
            Tokenizer.from_pretrained(tmp_path / "site")
    finally:
        sys.modules.pop("fd_test_tok_plugin", None)
