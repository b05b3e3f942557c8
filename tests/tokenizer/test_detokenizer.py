"""Incremental detokenizer: deltas add up to decode(ids), complete characters only, O(new tokens)."""

from __future__ import annotations

import random

import pytest

from fd_core.tokenizer import IncrementalDetokenizer, Tokenizer

from .strings import random_texts


def stream(tok: Tokenizer, ids: list[int], skip: bool, chunk: int = 1) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = [detok.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return deltas, detok.finish()


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("chunk", [1, 3])
def test_random_ids_concatenate_to_decode(tok: Tokenizer, skip: bool, chunk: int) -> None:
    rng = random.Random(chunk)
    byte_ids = [i for i in range(len(tok)) if tok.convert_ids_to_tokens(i).startswith("<0x")]
    for _ in range(200):
        # mix in runs of byte pieces so multi-byte characters get split and broken
        ids = [
            rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(len(tok))
            for _ in range(40)
        ]
        deltas, tail = stream(tok, ids, skip, chunk)
        assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=skip)


def test_every_id_in_padded_vocab(padded_tok: Tokenizer) -> None:
    ids = list(range(padded_tok.vocab_size))
    random.Random(0).shuffle(ids)
    for skip in (False, True):
        deltas, tail = stream(padded_tok, ids, skip)
        assert "".join(deltas) + tail == padded_tok.decode(ids, skip_special_tokens=skip)


def test_encoded_text_streams_exactly(tok: Tokenizer) -> None:
    for text in random_texts(seed=5, count=200) + ["中文和表情😀👨‍👩‍👧 mixed text"]:
        deltas, tail = stream(tok, tok.encode(text), skip=False)
        assert "".join(deltas) == text and tail == ""
        assert all("\ufffd" not in d for d in deltas) or "\ufffd" in text


def test_split_character_waits_until_complete(tok: Tokenizer) -> None:
    ids = [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "😀".encode()]
    detok = IncrementalDetokenizer(tok)
    assert [detok.add(i) for i in ids[:3]] == ["", "", ""]
    assert detok.has_pending_bytes
    assert detok.add(ids[3]) == "😀" and not detok.has_pending_bytes
    detok.add(ids[:2])  # a truncated character comes out as U+FFFD only at the end, as decode does
    assert detok.finish() == "\ufffd" == tok.decode(ids[:2])
    assert detok.text == "😀\ufffd"


def test_special_tokens_and_spaces(tok: Tokenizer) -> None:
    ids = tok.encode("<|begin_of_sentence|>  hello world<|end_of_sentence|>")
    assert "".join(stream(tok, ids, skip=True)[0]) == "  hello world"
    assert (
        "".join(stream(tok, ids, skip=False)[0])
        == "<|begin_of_sentence|>  hello world<|end_of_sentence|>"
    )


def test_does_not_redecode_the_sequence(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    detok = IncrementalDetokenizer(tok)
    monkeypatch.setattr(tok, "decode", lambda *a, **k: pytest.fail("add() must not call decode"))
    for i in tok.encode("streaming text " * 50):
        detok.add(i)
    assert detok.text == "streaming text " * 50


def test_dummy_prefix_model_matches_sentencepiece(tiny_dir) -> None:  # noqa: ANN001
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb2

    proto = pb2.ModelProto()
    proto.ParseFromString((tiny_dir / "tokenizer.model").read_bytes())
    proto.normalizer_spec.add_dummy_prefix = True  # the classic sentencepiece setting
    model = proto.SerializeToString()
    tok = Tokenizer(model, {}, {})
    sp = spm.SentencePieceProcessor(model_proto=model)
    for text in ["hello world", "  two spaces", "中文 text"]:
        ids = sp.encode(text)
        assert tok.encode(text) == ids and tok.decode(ids) == sp.decode(ids)
        deltas, tail = stream(tok, ids, skip=False)
        assert "".join(deltas) + tail == sp.decode(ids)
