"""Hiding secrets in configuration shown to people (/config-info, env logs).

A value is secret when its name says so: the last word of the name is
``key``/``keys``/``token``/``ak``/``sk``/``headers`` (``api_key``, ``FD_API_KEY``,
``hf_token``, ``ENCODE_FEATURE_BOS_SK``) or any word is ``password``/``secret``/
``credential`` (``scheduler_password``). Counting names such as
``max_num_batched_tokens`` or ``long_prefill_token_threshold`` are not secret.
Credentials inside URLs (``redis://user:pass@host``) are masked wherever they
appear. Pure Python, no imports beyond the standard library.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MASK", "is_secret_name", "mask_secrets"]

MASK = "***"
_LAST_WORDS = {"key", "keys", "apikey", "token", "ak", "sk", "headers"}
_ANY_WORDS = {"password", "passwd", "pwd", "secret", "secrets", "credential", "credentials"}
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")


def is_secret_name(name: str) -> bool:
    """Whether a setting called ``name`` holds a secret (see the module docstring)."""
    words = [w for w in re.split(r"[_\-.\s]+", name.lower()) if w]
    return bool(words) and (words[-1] in _LAST_WORDS or any(w in _ANY_WORDS for w in words))


def _mask_url(text: str) -> str:
    return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{MASK}@", text)


def mask_secrets(value: Any, name: str = "") -> Any:
    """A copy of ``value`` (dicts, lists, tuples, scalars) with every secret replaced
    by ``"***"``. Unset secrets (None, empty) stay as they are, so one can see
    that none was given."""
    if isinstance(value, dict):
        return {k: mask_secrets(v, str(k)) for k, v in value.items()}
    if name and is_secret_name(name) and value not in (None, "", [], ()):
        if isinstance(value, (list, tuple)):
            return [MASK for _ in value]
        return MASK
    if isinstance(value, (list, tuple)):
        return [mask_secrets(v) for v in value]
    if isinstance(value, str):
        return _mask_url(value)
    return value
