"""Tokenization: the sentencepiece tokenizer, chat templates and incremental detokenizer.

Owns turning text and chat messages into token ids and generated ids back into
streamed text. Runs in the API process, so it may import only the standard
library, sentencepiece (with its protobuf model description) and jinja2:
never paddle, torch, numpy or transformers. `spm_builder` trains the small
ERNIE-style tokenizers that generated test checkpoints ship.
"""

from fd_core.tokenizer.chat_template import ERNIE_CHAT_TEMPLATE, ChatTemplate, load_chat_template
from fd_core.tokenizer.detokenizer import IncrementalDetokenizer
from fd_core.tokenizer.tokenizer import Tokenizer

__all__ = [
    "ERNIE_CHAT_TEMPLATE",
    "ChatTemplate",
    "IncrementalDetokenizer",
    "Tokenizer",
    "load_chat_template",
]
