"""`HFTokenizer`: a byte-level BPE ``tokenizer.json`` tokenizer (Qwen, Llama 3, GPT-2 style).

Reads the files a HF checkpoint ships (tokenizer.json, tokenizer_config.json,
optional chat_template.jinja and generation_config.json) with the
``tokenizers`` library and jinja2, and offers the engine and the server the
same interface as the sentencepiece `Tokenizer`. Encoding is the
``tokenizers`` pipeline itself (added tokens cut out first, then normalizer,
pre-tokenizer, BPE), so ids equal HF transformers'. Decoding maps every id to
its bytes (the byte-level alphabet read back, an added token's UTF-8) and
decodes the joined bytes as UTF-8 with errors="replace", which is what the
incremental detokenizer reproduces byte for byte. Only byte-level decoders
are taken: other ``tokenizer.json`` decoders (Metaspace, WordPiece) are refused by name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fd_core.tokenizer.chat_template import load_chat_template
from fd_core.tokenizer.tokenizer import _NAMED_TOKENS, _read_json, _token_text
from fd_core.tokenizer.vocab_tables import VocabTables

__all__ = ["HFTokenizer"]


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, read back: printable char -> the byte it stands for."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


_BYTE_OF = _byte_alphabet()


def _is_byte_level(decoder: Any) -> bool:
    if not isinstance(decoder, Mapping):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return decoder.get("type") == "Sequence" and any(_is_byte_level(d) for d in decoder.get("decoders", []))


class HFTokenizer(VocabTables):
    """Byte-level BPE tokenizer from ``tokenizer.json``, with added tokens and a chat template.

    Build one with `HFTokenizer.from_pretrained(model_dir)`. `vocab_size` is
    the number of ids that decode (the BPE vocabulary plus added tokens).
    """

    def __init__(
        self,
        tokenizer_json: str,
        special_tokens: Mapping[str, str],
        chat_template: str | None = None,
        eos_token_ids: Sequence[int] | None = None,
        model_max_length: int | None = None,
    ) -> None:
        """`tokenizer_json`: the file's text; `special_tokens`: name -> content ("eos_token" -> "<|im_end|>")."""
        from tokenizers import Tokenizer as RustTokenizer

        spec = json.loads(tokenizer_json)
        decoder = spec.get("decoder")
        if not _is_byte_level(decoder):
            kind = decoder.get("type") if isinstance(decoder, Mapping) else decoder
            raise ValueError(
                f"tokenizer.json has decoder {kind!r}; fd_core reads byte-level BPE tokenizer.json files "
                "(decoder 'ByteLevel', as Qwen and Llama 3 ship) or a sentencepiece tokenizer.model"
            )
        self._tok = RustTokenizer.from_str(tokenizer_json)
        self.special_tokens: dict[str, str] = dict(special_tokens)
        self.chat_template = chat_template
        self.model_max_length = model_max_length
        added = {int(t["id"]): (str(t["content"]), bool(t.get("special", False)))
                 for t in spec.get("added_tokens", [])}
        self._build_tables(added)
        eos = self.eos_token_id
        self.eos_token_ids: list[int] = list(eos_token_ids or ([] if eos is None else [eos]))

    def _build_tables(self, added: Mapping[int, tuple[str, bool]]) -> None:
        vocab = self._tok.get_vocab(with_added_tokens=True)  # token -> id
        size = max(vocab.values(), default=-1) + 1
        self._pieces: list[str] = [""] * size
        for token, i in vocab.items():
            self._pieces[i] = token
        self._bytes: list[bytes] = [
            bytes(_BYTE_OF[c] for c in piece) if all(c in _BYTE_OF for c in piece) else piece.encode("utf-8")
            for piece in self._pieces
        ]
        self._added: dict[str, int] = {}
        special: set[int] = set()
        for i, (content, is_special) in added.items():
            self._bytes[i] = content.encode("utf-8")
            self._added[content] = i
            if is_special:
                special.add(i)
        for content in self.special_tokens.values():
            if content in vocab:
                special.add(vocab[content])
        self._vocab = vocab
        self._special_ids = frozenset(special)
        self._added_ids = frozenset(self._added.values())
        self._max_token_bytes = max((len(b) for b in self._bytes), default=1) or 1

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], chat_template: str | os.PathLike[str] | None = None
    ) -> HFTokenizer:
        """Load from a checkpoint directory. `chat_template` (a path or jinja text) overrides the stored one."""
        root = Path(path)
        json_file = root / "tokenizer.json"
        if not json_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {root}")
        config = _read_json(root / "tokenizer_config.json")
        special = {name: t for name in _NAMED_TOKENS if (t := _token_text(config.get(name))) is not None}
        template = config.get("chat_template")
        if isinstance(template, list):  # HF's named templates: [{"name": "default", "template": ...}]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if (root / "chat_template.jinja").is_file():
            template = (root / "chat_template.jinja").read_text(encoding="utf-8")
        if chat_template is not None:
            template = load_chat_template(chat_template)
        eos = _read_json(root / "generation_config.json").get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else eos
        return cls(json_file.read_text(encoding="utf-8"), special, template, eos_ids,
                   config.get("model_max_length"))

    # ---- ids and special tokens -------------------------------------------------
    def _named_id(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        return None if token is None else self._vocab.get(token)

    def convert_ids_to_tokens(self, ids: int | Iterable[int] | None) -> str | list[str] | None:
        """Vocabulary entries of ids; None for None, the id `convert_tokens_to_ids` gives a string
        that is no entry (so a lookup such as the reasoning budget's newline probe reads "none")."""
        if ids is None:
            return None
        if isinstance(ids, int):
            return self._pieces[self._check_id(ids)]
        return [self._pieces[self._check_id(i)] for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | None | list[int | None]:
        """Ids of vocabulary entries (byte-level spelled, e.g. "Ġthe"); None for a string that is none, as HF."""
        if isinstance(tokens, str):
            return self._vocab.get(tokens)
        return [self._vocab.get(t) for t in tokens]

    # ---- encode / decode --------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; added tokens in it become single ids. `add_special_tokens` runs the
        tokenizer.json post-processor (Qwen's adds nothing).

        `split_special_tokens` (HF's name): added-token strings are plain text, encoded by the BPE alone."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"the text is not valid Unicode: a lone surrogate {text[exc.start]!r} at "
                             f"position {exc.start}") from None
        if split_special_tokens:
            return self._encode_literal(text)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def _encode_literal(self, text: str) -> list[int]:
        """`text` through normalizer, pre-tokenizer and BPE only: the added-token matcher never
        runs, so no added or special id comes out (a word the BPE itself maps to one is
        encoded character by character)."""
        tok = self._tok
        if tok.normalizer is not None:
            text = tok.normalizer.normalize_str(text)
        words = tok.pre_tokenizer.pre_tokenize_str(text) if tok.pre_tokenizer is not None else [(text, (0, 0))]
        ids: list[int] = []
        for word, _ in words:
            piece = [t.id for t in tok.model.tokenize(word)]
            if not self._added_ids.isdisjoint(piece):
                piece = [t.id for ch in word for t in tok.model.tokenize(ch)]
            ids.extend(piece)
        return ids

    @property
    def max_token_bytes(self) -> int:
        """Bytes of the longest token, so text of n characters is at least n / this many tokens."""
        return self._max_token_bytes

    def token_bytes(self, token_id: int, skip_special_tokens: bool = False) -> bytes:
        """The bytes id `token_id` contributes to decoded text (b"" for a skipped special token).

        An id past the tokenizer's vocabulary (a checkpoint pads its embedding rows
        beyond it, as Qwen3's 151936 rows for 151669 tokens) decodes to b"", as HF drops it."""
        if token_id >= len(self._pieces):
            return b""
        if skip_special_tokens and token_id in self._special_ids:
            return b""
        return self._bytes[self._check_id(token_id)]

    @property
    def strips_leading_space(self) -> bool:
        """Byte-level BPE decodes every space it encoded: nothing to strip."""
        return False

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD, as in Python's "replace"."""
        return b"".join(self.token_bytes(i, skip_special_tokens) for i in ids).decode("utf-8", errors="replace")
