"""`Tokenizer`: a sentencepiece tokenizer with HF-style added tokens and a chat template.

Reads the files a HF checkpoint ships (tokenizer.model, tokenizer_config.json,
optional chat_template.jinja and generation_config.json) with sentencepiece
and jinja2 only. Encoding first cuts the text at added/special tokens (each
becomes one id, leftmost-longest match, as HF does), then encodes the pieces in
between with sentencepiece, so normal text never produces an added token's id.
Decoding maps every id to its bytes and decodes the whole byte string as UTF-8,
which makes decoding exact for byte-fallback pieces and lets the incremental
detokenizer reproduce it byte for byte.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fd_core.tokenizer.chat_template import ERNIE_CHAT_TEMPLATE, load_chat_template
from fd_core.tokenizer.vocab_tables import VocabTables

__all__ = ["Tokenizer"]

_NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "cls_token",
    "sep_token",
    "mask_token",
)
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _token_text(value: Any) -> str | None:
    if isinstance(value, Mapping):  # {"content": "<s>", ...} in older configs
        return str(value.get("content"))
    return None if value is None else str(value)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


class Tokenizer(VocabTables):
    """Sentencepiece tokenizer with added tokens, special-token ids and a chat template.

    Build one with `Tokenizer.from_pretrained(model_dir)`. `vocab_size` is the
    number of ids that decode (sentencepiece pieces plus added tokens beyond them).
    """

    def __init__(
        self,
        model_proto: bytes,
        added_tokens: Mapping[int, tuple[str, bool]],
        special_tokens: Mapping[str, str],
        chat_template: str | None = None,
        eos_token_ids: Sequence[int] | None = None,
        model_max_length: int | None = None,
    ) -> None:
        """`added_tokens`: id -> (content, is_special); `special_tokens`: name -> content."""
        import sentencepiece as spm

        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        # normalizer_spec.add_dummy_prefix, read without protobuf: is "a" encoded as "▁a"?
        self._add_dummy_prefix = self._sp.encode("a", out_type=str)[0].startswith("\u2581")
        self.special_tokens: dict[str, str] = dict(special_tokens)  # e.g. "bos_token" -> "<s>"
        self.model_max_length = model_max_length
        self._build_tables(added_tokens)
        self.chat_template = chat_template or ERNIE_CHAT_TEMPLATE
        eos = self.eos_token_id
        self.eos_token_ids: list[int] = list(eos_token_ids or ([] if eos is None else [eos]))

    def _build_tables(self, added_tokens: Mapping[int, tuple[str, bool]]) -> None:
        sp = self._sp
        size = max([sp.get_piece_size(), *(i + 1 for i in added_tokens)])
        self._pieces: list[str] = [
            sp.id_to_piece(i) if i < sp.get_piece_size() else "" for i in range(size)
        ]
        self._bytes: list[bytes] = []
        self._max_token_bytes: int | None = None
        special: set[int] = set()
        for i, piece in enumerate(self._pieces):
            if i >= sp.get_piece_size():
                data = b""
            elif sp.is_byte(i):
                data = bytes([int(_BYTE_PIECE.fullmatch(piece).group(1), 16)])  # type: ignore[union-attr]
            elif sp.is_control(i) or sp.is_unknown(i):
                data = piece.encode("utf-8")
                special.add(i)
            else:
                data = piece.replace("\u2581", " ").encode("utf-8")
            self._bytes.append(data)
        self._added: dict[str, int] = {}
        for i, (content, is_special) in sorted(added_tokens.items()):
            self._pieces[i] = content
            self._bytes[i] = content.encode("utf-8")
            self._added[content] = i
            (special.add if is_special else special.discard)(i)
        for content in self.special_tokens.values():
            if content in self._added:
                special.add(self._added[content])
        self._special_ids = frozenset(special)
        self._protected_ids = frozenset(special) | frozenset(self._added.values())
        alternatives = sorted(self._added, key=len, reverse=True)  # leftmost-longest, like HF
        self._added_re = (
            re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
        )

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], chat_template: str | os.PathLike[str] | None = None
    ) -> Tokenizer:
        """Load from a checkpoint directory. `chat_template` (a path or jinja text) overrides the stored one."""
        root = Path(path)
        model_file = root / "tokenizer.model"
        if not model_file.is_file():
            raise FileNotFoundError(
                f"no tokenizer.model in {root}: fd_core needs a sentencepiece tokenizer model"
            )
        config = _read_json(root / "tokenizer_config.json")
        added = {
            int(i): (str(entry["content"]), bool(entry.get("special", True)))
            for i, entry in (config.get("added_tokens_decoder") or {}).items()
        }
        for content, i in _read_json(root / "added_tokens.json").items():
            added.setdefault(int(i), (content, True))
        special = {
            name: t for name in _NAMED_TOKENS if (t := _token_text(config.get(name))) is not None
        }
        template = config.get("chat_template")
        if isinstance(
            template, list
        ):  # HF's named templates: [{"name": "default", "template": ...}]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if (root / "chat_template.jinja").is_file():
            template = (root / "chat_template.jinja").read_text(encoding="utf-8")
        if chat_template is not None:
            template = load_chat_template(chat_template)
        eos = _read_json(root / "generation_config.json").get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else eos
        return cls(
            model_file.read_bytes(),
            added,
            special,
            template,
            eos_ids,
            config.get("model_max_length"),
        )

    # ---- ids and special tokens -------------------------------------------------
    def _named_id(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        return None if token is None else self._token_to_id(token)

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        if isinstance(ids, int):
            return self._pieces[self._check_id(ids)]
        return [self._pieces[self._check_id(i)] for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self._token_to_id(tokens)
        return [self._token_to_id(t) for t in tokens]

    def _token_to_id(self, token: str) -> int:
        i = self._added.get(token)
        return i if i is not None else int(self._sp.piece_to_id(token))

    # ---- encode / decode --------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; added tokens in it become single ids. `add_special_tokens` prepends bos.

        `split_special_tokens` (HF's name): added-token strings are plain text, encoded piece by piece."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # sentencepiece would fail with an opaque RuntimeError
            raise ValueError(f"the text is not valid Unicode: a lone surrogate {text[exc.start]!r} at "
                             f"position {exc.start}") from None
        ids: list[int] = []
        if add_special_tokens and self.bos_token_id is not None:
            ids.append(self.bos_token_id)
        start = 0
        if split_special_tokens:
            return ids + self._encode_literal(text)
        if self._added_re is not None:
            for match in self._added_re.finditer(text):
                if match.start() > start:
                    ids.extend(self._sp.encode(text[start : match.start()]))
                ids.append(self._added[match.group()])
                start = match.end()
        if start < len(text):
            ids.extend(self._sp.encode(text[start:]))
        return ids

    def _encode_literal(self, text: str) -> list[int]:
        """`text` as ordinary pieces: no added or special token comes out, even one the
        sentencepiece model itself matches (user-defined pieces). Each added-token string is
        cut after its first character; a piece that still encodes to a protected id is
        encoded character by character."""
        if self._added_re is None:
            return list(self._sp.encode(text))
        cuts = [m.start() + 1 for m in self._added_re.finditer(text)]
        protected = self._protected_ids
        ids: list[int] = []
        for start, end in zip([0, *cuts], [*cuts, len(text)]):
            if start == end:
                continue
            piece = self._sp.encode(text[start:end])
            if not protected.isdisjoint(piece):
                piece = [i for ch in text[start:end] for i in self._sp.encode(ch)]
            ids.extend(piece)
        return ids

    @property
    def max_token_bytes(self) -> int:
        """Bytes of the longest token, so text of n characters is at least n / this many tokens."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max((len(b) for b in self._bytes), default=1) or 1
        return self._max_token_bytes

    def token_bytes(self, token_id: int, skip_special_tokens: bool = False) -> bytes:
        """The bytes id `token_id` contributes to decoded text (b"" for a skipped special token)."""
        if skip_special_tokens and token_id in self._special_ids:
            return b""
        return self._bytes[self._check_id(token_id)]

    @property
    def strips_leading_space(self) -> bool:
        """True when the model adds a dummy "▁" prefix, which decoding removes again."""
        return bool(self._add_dummy_prefix)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 from byte pieces becomes U+FFFD, as in Python's "replace"."""
        data = b"".join(self.token_bytes(i, skip_special_tokens) for i in ids)
        text = data.decode("utf-8", errors="replace")
        if self._add_dummy_prefix and text.startswith(" "):
            text = text[1:]
        return text
