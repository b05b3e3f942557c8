"""Build an ERNIE-style sentencepiece tokenizer from local text, and write its files.

Real ERNIE 4.5 tokenizers cannot be downloaded here, so generated checkpoints
(`fd_core.testing.checkpoints`) carry a small BPE sentencepiece model trained
on local text, with ERNIE's special tokens at fixed ids and byte fallback so
that any unicode string round-trips. `pad_model` appends unused pieces so a
model with a larger vocabulary (0.3B: 103424) can emit any id and still decode.

Training is deterministic (one thread, no sampling, no shuffling): the same
text and size give the same model bytes.
"""

from __future__ import annotations

import functools
import io
import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path

from fd_core.tokenizer.chat_template import ERNIE_CHAT_TEMPLATE
from fd_core.tokenizer.special_tokens import (
    ADDED_TOKENS,
    BOS_TOKEN,
    CLS_TOKEN,
    EOS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    SEP_TOKEN,
    SPECIAL_TOKENS,
    UNK_TOKEN,
)

__all__ = ["UNUSED_PIECE", "pad_model", "train_model", "write_tokenizer_files"]

UNUSED_PIECE = "<unused_{}>"  # padding pieces, by id; unreachable from text
_UNUSED_SCORE = -1.0e9


@functools.lru_cache(maxsize=4)
def _train_cached(corpus: tuple[str, ...], vocab_size: int) -> bytes:
    import sentencepiece as spm

    lines = [line for text in corpus for line in text.splitlines() if line.strip()]
    model = io.BytesIO()
    with open(os.devnull, "w") as devnull:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            logstream=devnull,
            model_type="bpe",
            vocab_size=vocab_size,
            character_coverage=0.9995,
            byte_fallback=True,
            normalization_rule_name="identity",  # no NFKC: text round-trips exactly
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            split_digits=True,
            allow_whitespace_only_pieces=True,
            user_defined_symbols=list(SPECIAL_TOKENS + ADDED_TOKENS),
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            unk_piece=UNK_TOKEN,
            bos_piece=BOS_TOKEN,
            eos_piece=EOS_TOKEN,
            num_threads=1,
            shuffle_input_sentence=False,
            input_sentence_size=0,
            max_sentence_length=1 << 16,
        )
    return model.getvalue()


def train_model(corpus: Sequence[str], vocab_size: int = 2048) -> bytes:
    """Train a BPE sentencepiece model on `corpus` texts; returns the model bytes.

    `vocab_size` counts every piece: <unk>, <s>, </s>, ERNIE's special and added
    tokens, the 256 byte-fallback pieces and the learned merges.
    """
    return _train_cached(tuple(corpus), vocab_size)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _piece_record(piece: str, score: float) -> bytes:
    """One `ModelProto.pieces` entry in protobuf wire format (type NORMAL, the default)."""
    text = piece.encode("utf-8")
    body = b"\x0a" + _varint(len(text)) + text + b"\x15" + struct.pack("<f", score)
    return b"\x0a" + _varint(len(body)) + body


def pad_model(model: bytes, vocab_size: int) -> bytes:
    """Append `<unused_N>` pieces until the model has exactly `vocab_size` pieces.

    The pieces are normal pieces with a score no merge can reach (no other
    piece is a prefix of them), so encoding never produces them, while
    decoding any id in [0, vocab_size) works. Protobuf appends repeated fields
    that follow a message, so the records are simply concatenated (no protobuf
    library needed).
    """
    import sentencepiece as spm

    size = spm.SentencePieceProcessor(model_proto=model).get_piece_size()
    if vocab_size < size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {size} pieces")
    records = (
        _piece_record(UNUSED_PIECE.format(i), _UNUSED_SCORE) for i in range(size, vocab_size)
    )
    return model + b"".join(records)


def _token_entry(content: str, special: bool) -> dict[str, object]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def write_tokenizer_files(
    out_dir: str | os.PathLike[str],
    model: bytes,
    *,
    model_max_length: int,
    chat_template: str = ERNIE_CHAT_TEMPLATE,
) -> int:
    """Write tokenizer.model, tokenizer_config.json and special_tokens_map.json.

    Returns the number of pieces (the tokenizer's vocab size). The config is the
    HF format, loadable offline by `transformers.AutoTokenizer` (which builds a
    `TokenizersBackend` from tokenizer.model for ernie4_5 model types) and by
    `fd_core.tokenizer.Tokenizer`.
    """
    import sentencepiece as spm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    decoder = {
        str(sp.piece_to_id(tok)): _token_entry(tok, tok not in ADDED_TOKENS)
        for tok in (UNK_TOKEN, BOS_TOKEN, EOS_TOKEN) + SPECIAL_TOKENS + ADDED_TOKENS
    }
    named = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": UNK_TOKEN,
        "pad_token": PAD_TOKEN,
        "cls_token": CLS_TOKEN,
        "sep_token": SEP_TOKEN,
        "mask_token": MASK_TOKEN,
    }
    additional = [t for t in SPECIAL_TOKENS if t not in named.values()]
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": decoder,
        **named,
        "additional_special_tokens": additional,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "split_special_tokens": False,
        "tokenizer_class": "TokenizersBackend",
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", {**named, "additional_special_tokens": additional})
    return sp.get_piece_size()


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
