"""Tokenization: tokenizers, chat templates and the incremental detokenizer.

Owns turning text and chat messages into token ids and generated ids back into
streamed text. Two tokenizers offer one interface: the sentencepiece one
(``tokenizer.model``, ERNIE) and the byte-level BPE one (``tokenizer.json``,
Qwen); ``Tokenizer.from_pretrained`` picks by the files in the directory
(``tokenizer.model`` first), then asks general plugins (``fd_load_tokenizer``).
Runs in the API process, so it may import only the standard library,
sentencepiece (with its protobuf model description), the ``tokenizers``
library, jinja2 and fd_core.plugins: never paddle, torch, numpy or transformers.
May import: fd_core.plugins.
`spm_builder` trains the small ERNIE-style tokenizers that generated test
checkpoints ship.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fd_core.plugins import manager
from fd_core.tokenizer.chat_template import ERNIE_CHAT_TEMPLATE, ChatTemplate, load_chat_template
from fd_core.tokenizer.detokenizer import IncrementalDetokenizer
from fd_core.tokenizer.hf_tokenizer import HFTokenizer
from fd_core.tokenizer.tokenizer import Tokenizer as SentencePieceTokenizer

__all__ = [
    "ERNIE_CHAT_TEMPLATE",
    "ChatTemplate",
    "HFTokenizer",
    "IncrementalDetokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "load_chat_template",
    "load_tokenizer",
]


def load_tokenizer(
    path: str | os.PathLike[str], chat_template: str | os.PathLike[str] | None = None
) -> SentencePieceTokenizer | HFTokenizer:
    """The tokenizer of a checkpoint directory: sentencepiece when it holds
    ``tokenizer.model``, else byte-level BPE from ``tokenizer.json``."""
    return Tokenizer.from_pretrained(path, chat_template)


class Tokenizer(SentencePieceTokenizer):
    """The sentencepiece tokenizer, whose ``from_pretrained`` picks the tokenizer
    by the files present (so every caller of ``Tokenizer.from_pretrained`` reads
    Qwen's ``tokenizer.json`` too)."""

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls, path: str | os.PathLike[str], chat_template: str | os.PathLike[str] | None = None
    ) -> SentencePieceTokenizer | HFTokenizer:
        root = Path(path)
        if (root / "tokenizer.model").is_file():
            return super().from_pretrained(root, chat_template)
        if (root / "tokenizer.json").is_file():
            return HFTokenizer.from_pretrained(root, chat_template)
        found = _plugin_tokenizer(root, chat_template)
        if found is not None:
            return found  # type: ignore[no-any-return]
        raise FileNotFoundError(
            f"no tokenizer in {root}: expected tokenizer.model (sentencepiece) or tokenizer.json "
            "(byte-level BPE), and no plugin's fd_load_tokenizer reads this directory"
        )


def _plugin_tokenizer(root: Path, chat_template: str | os.PathLike[str] | None) -> Any:
    """The first general plugin's ``fd_load_tokenizer`` answer for ``root``, or None."""
    modules = manager.load_general_plugins()
    if not modules:
        return None
    return manager.make_plugin_manager(*modules).hook.fd_load_tokenizer(path=root, chat_template=chat_template)
