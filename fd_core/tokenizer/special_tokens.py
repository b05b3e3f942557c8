"""ERNIE 4.5's special and added tokens, as its released tokenizers name them.

"Special" tokens are control tokens: `decode(..., skip_special_tokens=True)`
drops them. "Added" tokens (the thinking / tool-call markers) are also always
encoded as one id and never split out of normal text, but they are ordinary
text on decode, so reasoning and tool-call parsers can see them.
"""

from __future__ import annotations

__all__ = [
    "ADDED_TOKENS",
    "BOS_TOKEN",
    "CLS_TOKEN",
    "EOS_TOKEN",
    "MASK_TOKEN",
    "PAD_TOKEN",
    "SEP_TOKEN",
    "SPECIAL_TOKENS",
    "UNK_TOKEN",
]

UNK_TOKEN = "<unk>"  # id 0; also the pad token, as in ERNIE 4.5 (pad_token_id 0)
BOS_TOKEN = "<s>"  # id 1 (config.json bos_token_id)
EOS_TOKEN = "</s>"  # id 2 (config.json eos_token_id)
PAD_TOKEN = UNK_TOKEN
CLS_TOKEN = "<|begin_of_sentence|>"  # opens every chat prompt
SEP_TOKEN = "<|end_of_sentence|>"  # closes every assistant turn: an eos for chat
MASK_TOKEN = "<mask:1>"

# Control tokens after <unk>, <s>, </s> (which sentencepiece places at 0, 1, 2).
SPECIAL_TOKENS: tuple[str, ...] = (
    CLS_TOKEN,
    SEP_TOKEN,
    "<mask:0>",
    "<mask:1>",
    "<mask:2>",
    "<mask:3>",
    "<|IMAGE_START|>",
    "<|IMAGE_END|>",
    "<|IMAGE_PLACEHOLDER|>",
    "<|IMAGE_SEP|>",
    "<|VIDEO_START|>",
    "<|VIDEO_END|>",
    "<|AUDIO_PLACEHOLDER|>",
    "<|LOC_BEGIN|>",
    "<|LOC_END|>",
    "<|LOC_SEP|>",
    "<|CROP_COL_SEP|>",
    "<|CROP_ROW_SEP|>",
)

# Non-special added tokens: single ids, kept by skip_special_tokens.
ADDED_TOKENS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<response>",
    "</response>",
    "<tool_call>",
    "</tool_call>",
    "<tool_output>",
    "</tool_output>",
)
