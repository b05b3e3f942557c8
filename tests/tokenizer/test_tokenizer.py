"""Tokenizer: round-trips, added/special tokens, ids equal to HF's, every id decodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fd_core.tokenizer import Tokenizer
from fd_core.tokenizer.special_tokens import ADDED_TOKENS, SPECIAL_TOKENS
from fd_core.tokenizer.spm_builder import _train_cached, train_model

from .conftest import PADDED_VOCAB
from .strings import random_texts

ALL_ADDED = ("<unk>", "<s>", "</s>") + SPECIAL_TOKENS + ADDED_TOKENS


def test_round_trip_random_unicode(tok: Tokenizer) -> None:
    for text in random_texts(seed=1, count=400):
        assert tok.decode(tok.encode(text)) == text


def test_round_trip_sample_text(tok: Tokenizer) -> None:
    text = "  Leading spaces, 中文、日本語、한국어 😀👨‍👩‍👧 e\u0301 \t\n\n  trailing  "
    assert tok.decode(tok.encode(text)) == text


def test_added_and_special_tokens_are_single_ids(tok: Tokenizer) -> None:
    for token in ALL_ADDED:
        token_id = tok.convert_tokens_to_ids(token)
        assert tok.encode(token) == [token_id]
        ids = tok.encode(f"abc{token}def")
        assert ids.count(token_id) == 1 and tok.decode(ids) == f"abc{token}def"


def test_split_special_tokens_keeps_added_token_strings_as_text(tok: Tokenizer) -> None:
    """--escape-special-tokens relies on this: no added or special id comes out, the text survives."""
    reserved = set(tok.added_tokens.values()) | {tok.convert_tokens_to_ids(t) for t in ("<unk>", "<s>", "</s>")}
    for token in ALL_ADDED:
        for text in (token, f"abc{token}def", token * 3, f"{token[:-1]}{token}"):
            ids = tok.encode(text, split_special_tokens=True)
            assert not reserved & set(ids), (text, ids)
            assert tok.decode(ids) == text
    for text in random_texts(seed=3, count=100):  # text without them encodes as usual
        assert tok.encode(text, split_special_tokens=True) == tok.encode(text)


def test_normal_text_never_yields_added_ids(padded_tok: Tokenizer) -> None:
    reserved = set(padded_tok.added_tokens.values()) | set(range(2048, PADDED_VOCAB))
    near_misses = "<think <|IMAGE_START| </s <unused_3000 <unused_> <mask:9> <|LOC_0|>"
    for text in random_texts(seed=2, count=300) + [near_misses, "<unused_3000>"]:
        assert not reserved & set(padded_tok.encode(text)), text


def test_ids_and_names(tok: Tokenizer) -> None:
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    sep = tok.convert_tokens_to_ids("<|end_of_sentence|>")
    assert tok.eos_token_ids == [2, sep]
    assert tok.vocab_size == len(tok) == 2048
    assert tok.convert_tokens_to_ids("<|begin_of_sentence|>") in tok.all_special_ids
    assert tok.convert_tokens_to_ids("<think>") not in tok.all_special_ids
    assert tok.encode("hi", add_special_tokens=True)[0] == 1
    assert tok.convert_ids_to_tokens(tok.encode("中")) == ["中"]


def test_skip_special_tokens_keeps_thinking_markers(tok: Tokenizer) -> None:
    text = "<|begin_of_sentence|>User: hi\nAssistant: <think>hmm</think>ok<|end_of_sentence|></s>"
    assert (
        tok.decode(tok.encode(text), skip_special_tokens=True)
        == "User: hi\nAssistant: <think>hmm</think>ok"
    )


def test_every_id_decodes_in_padded_vocab(padded_tok: Tokenizer) -> None:
    assert padded_tok.vocab_size == PADDED_VOCAB
    text = padded_tok.decode(range(PADDED_VOCAB))
    assert text.endswith(f"<unused_{PADDED_VOCAB - 1}>")
    with pytest.raises(ValueError, match="out of range"):
        padded_tok.decode([PADDED_VOCAB])


def test_ids_equal_hf(tok: Tokenizer, hf_tok) -> None:  # noqa: ANN001
    for text in random_texts(seed=3, count=300) + ["<think>x</think><s>  <|IMAGE_PLACEHOLDER|>"]:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == hf_tok.decode(ids)
        assert tok.decode(ids, skip_special_tokens=True) == hf_tok.decode(
            ids, skip_special_tokens=True
        )


def test_padded_tokenizer_equals_hf(padded_dir: Path, padded_tok: Tokenizer) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(padded_dir)
    assert len(hf) == PADDED_VOCAB
    for text in random_texts(seed=4, count=50) + ["<unused_5000> x"]:
        assert padded_tok.encode(text) == hf.encode(text, add_special_tokens=False)


def test_training_is_deterministic(tiny_dir: Path) -> None:
    from fd_core.testing.checkpoints import _DATA, _TOKENIZER_PIECES

    corpus = [p.read_text(encoding="utf-8") for p in sorted(_DATA.glob("*.txt"))]
    fresh = _train_cached.__wrapped__(tuple(corpus), _TOKENIZER_PIECES)
    assert (
        fresh
        == train_model(corpus, _TOKENIZER_PIECES)
        == (tiny_dir / "tokenizer.model").read_bytes()
    )


def test_runtime_needs_only_sentencepiece_and_jinja(tiny_dir: Path) -> None:
    code = (
        "import sys, fd_core.tokenizer as t\n"
        f"tok = t.Tokenizer.from_pretrained({str(tiny_dir)!r})\n"
        "tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=True)\n"
        "heavy = {'paddle', 'torch', 'transformers', 'numpy', 'google.protobuf'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
