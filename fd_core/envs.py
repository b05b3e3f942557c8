"""Every FD_* environment variable fd-core reads, typed, read once.

Nothing else in fd_core reads ``os.environ`` for configuration (the
visible-devices variables and ``FD_X86_*`` belong to the backends that
declare them). Values are read on first access and cached; tests call
``reset()`` after changing the environment.

FastDeploy documents many more variables than have an effect here. Each of
them is known (``fd_core.env_catalog``): read here (``VARIABLES``), or named
as having no effect with the reason, or as a feature not implemented yet.
``log_no_effect`` says so at start-up, one line per variable that is set,
and names FD_* variables nobody knows (a typo guard).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from fd_core.env_catalog import NO_EFFECT, NOT_IMPLEMENTED, OWNED_PREFIXES
from fd_core.masking import mask_secrets

__all__ = [
    "VARIABLES", "check_values", "environment", "get", "log_no_effect", "reset", "unknown_variables",
]


def _str(default: str | None) -> Callable[[str | None], Any]:
    return lambda raw: default if raw is None or raw == "" else raw


def _bool(default: bool) -> Callable[[str | None], Any]:
    def parse(raw: str | None) -> bool:
        if raw is None or raw == "":
            return default
        value = raw.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean (1/0/true/false), got {raw!r}")

    return parse


def _int(default: int | None, minimum: int | None = None) -> Callable[[str | None], Any]:
    def parse(raw: str | None) -> int | None:
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
        if minimum is not None and value < minimum:
            raise ValueError(f"expected an integer >= {minimum}, got {raw!r}")
        return value

    return parse


def _float(default: float | None) -> Callable[[str | None], Any]:
    def parse(raw: str | None) -> float | None:
        if raw is None or raw == "":
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
        if value <= 0:
            raise ValueError(f"expected a positive number, got {raw!r}")
        return value

    return parse


def _csv(raw: str | None) -> tuple[str, ...] | None:
    if raw is None or raw.strip() == "":
        return None
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def _choice(default: str | None, choices: tuple[str, ...], upper: bool = False,
            aliases: dict[str, str] | None = None) -> Callable[[str | None], Any]:
    def parse(raw: str | None) -> str | None:
        if raw is None or raw.strip() == "":
            return default
        value = raw.strip().upper() if upper else raw.strip().lower()
        value = (aliases or {}).get(value, value)
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


THINK_END = "</think>"


def _think_truncate_str(raw: str | None) -> str:
    # kept verbatim (the newlines matter); a written "\n" means a newline, for
    # env files and shells where a real one is awkward
    if raw is None or raw == "":
        return THINK_END
    value = raw.replace("\\n", "\n")
    if THINK_END not in value:
        raise ValueError(f"expected text containing {THINK_END!r} (FastDeploy's {THINK_END!r} or "
                         f"'\\n{THINK_END}\\n\\n'), got {raw!r}")
    return value


# FastDeploy's attention backends; here attention is the --backend plugin's own kernel
ATTENTION_BACKENDS = ("APPEND_ATTN", "NATIVE_ATTN", "MLA_ATTN", "FLASH_ATTN", "FLASH_MASK_ATTN",
                      "BLOCK_ATTN", "PADDLE_NATIVE", "MOBA_ATTN", "DSA_ATTN")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MODEL_SOURCES = ("HUGGINGFACE", "AISTUDIO", "MODELSCOPE")

# name -> (parser, meaning)
VARIABLES: dict[str, tuple[Callable[[str | None], Any], str]] = {
    "FD_PLUGINS": (_csv, "comma-separated entry-point names of plugins/backends to load; unset loads all"),
    "FD_SAMPLING_CLASS": (
        _choice("base", ("base", "rejection"), aliases={"air": "base", "base_non_truncated": "base"}),
        "'rejection' selects the rejection top-k/top-p sampler; 'base' (and FastDeploy's 'air', "
        "'base_non_truncated', which sample the same distribution) the sort-based one"),
    "FD_DISABLE_CHUNKED_PREFILL": (_bool(False), "1 turns chunked prefill off"),
    "FD_CPU_NUM_THREADS": (_int(None, 1), "threads for the CPU backend's kernels; default: all cores"),
    "FD_CPU_KVCACHE_SPACE": (_float(None), "GiB cap on the CPU backend's KV cache; unset: sized to need"),
    "FD_TP_RENDEZVOUS_TIMEOUT": (_int(120, 1), "seconds the tensor-parallel ranks wait for each other to "
                                 "meet before the engine fails naming the missing rank; default 120"),
    "FD_MASTER_PORT": (_int(8190, 1), "--ips: the TCP port of the first host's rendezvous (the next port "
                       "carries the step messages to the other hosts); default 8190"),
    "FD_PD_TRANSFER_TIMEOUT": (_float(60.0), "seconds a decode instance waits for a prefill instance's KV "
                               "before the request fails naming it (--splitwise-role decode); default 60"),
    "FD_PD_ALLOWED_PREFILL_ADDRS": (_str(None), "host:port list of prefill instances a decode instance may "
                                    "take KV from when a request's x-fd-prefill-addr header names one, beyond "
                                    "its --innode-prefill-ports ('*': any; for fd-router deployments on a "
                                    "private network); default: none beyond them"),
    "FD_NODE_RANK": (_int(None, 0), "--ips: this host's position in the list; default: found from this "
                     "host's addresses"),
    # the raw text: the CLI splits it on commas (each key works, like --api-key repeated)
    "FD_API_KEY": (_str(None), "comma-separated API keys the server accepts (like --api-key, repeatable)"),
    "FD_LOG_LEVEL": (_choice(None, LOG_LEVELS, upper=True),
                     "log level of fd_core loggers (wins over FD_DEBUG); default INFO"),
    "FD_DEBUG": (_bool(False), "1 logs fd_core at DEBUG (per-step scheduler lines included)"),
    "FD_LOG_DIR": (_str("log"), "directory of the log files (FastDeploy's names); default ./log"),
    "FD_LOG_BACKUP_COUNT": (_int(7, 0), "days of rotated log files kept (daily rotation); default 7"),
    "FD_MODEL_SOURCE": (_choice(None, MODEL_SOURCES, upper=True),
                        "hub of model ids: HUGGINGFACE (the default here); AISTUDIO and MODELSCOPE "
                        "are refused by name"),
    "FD_MODEL_CACHE": (_str(None), "directory holding downloaded models as <dir>/<owner>/<name>; "
                                   "also the Hugging Face cache directory searched"),
    "FD_ATTENTION_BACKEND": (_choice(None, ATTENTION_BACKENDS, upper=True),
                             "accepted and checked; attention is the --backend plugin's kernel"),
    "FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR": (
        _think_truncate_str,
        "what the thinking budget (reasoning_max_tokens) forces when it is spent, tokenized once at "
        "engine start: '</think>' (default, ERNIE-4.5-VL) or '\\n</think>\\n\\n' (ERNIE-X1)"),
}

_cache: dict[str, Any] = {}


def get(name: str) -> Any:
    """Return the typed value of ``name``; raise ValueError naming a bad value."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not an fd-core environment variable; known: {sorted(VARIABLES)}")
    if name not in _cache:
        parser, _ = VARIABLES[name]
        try:
            _cache[name] = parser(os.environ.get(name))
        except ValueError as exc:
            raise ValueError(f"environment variable {name}: {exc}") from None
    return _cache[name]


def reset() -> None:
    """Forget cached values so the next ``get`` reads the environment again."""
    _cache.clear()


def check_values() -> None:
    """Parse every variable of ``VARIABLES`` that is set; raise ValueError naming
    the first bad value. Start-up calls it so a typo fails at once (exit 2)."""
    for name in VARIABLES:
        if name in os.environ:
            get(name)


def _is_known(name: str) -> bool:
    return (name in VARIABLES or name in NO_EFFECT or name in NOT_IMPLEMENTED
            or name.startswith(OWNED_PREFIXES))


def unknown_variables() -> list[str]:
    """FD_* variables set in the environment that nobody knows (typos, mostly)."""
    return sorted(n for n in os.environ if n.upper().startswith("FD_") and not _is_known(n))


def _value_note(name: str, raw: str) -> str | None:
    """Why a variable we read still does less than in FastDeploy, for this value."""
    if name == "FD_ATTENTION_BACKEND":
        return "attention kernels come from the --backend plugin (cpu, x86, cuda, ...); the value is checked only"
    if name == "FD_SAMPLING_CLASS" and raw.strip().lower() in ("air", "base_non_truncated"):
        return "sampled with the 'base' sampler, which draws from the same distribution"
    return None


def log_no_effect(logger: logging.Logger) -> None:
    """Say, once at start-up, what the FD_* environment does here.

    One INFO line per set variable that has no effect ("FD_X=... has no effect
    here: <reason>"), one WARNING per set variable naming a feature that is not
    implemented yet, and one WARNING naming every unknown FD_* variable. Never
    raises: variables are often set machine-wide.
    """
    for name in sorted(os.environ):
        raw = os.environ[name]
        shown = mask_secrets({name: raw})[name]
        if name in NO_EFFECT:
            logger.info("%s=%s has no effect here: %s", name, shown, NO_EFFECT[name])
        elif name in NOT_IMPLEMENTED:
            logger.warning("%s=%s is ignored: %s is not implemented yet", name, shown, NOT_IMPLEMENTED[name])
        elif name in VARIABLES:
            note = _value_note(name, raw)
            if note:
                logger.info("%s=%s has no effect here beyond being accepted: %s", name, shown, note)
    unknown = unknown_variables()
    if unknown:
        logger.warning("unknown FD_* environment variable(s), ignored (a typo?): %s", ", ".join(unknown))


def environment() -> dict[str, str]:
    """FD_* and FastDeploy's other variables set now, secrets masked (for
    /config-info and the env log)."""
    names = [n for n in os.environ if n.upper().startswith("FD_") or _is_known(n)]
    return mask_secrets({n: os.environ[n] for n in sorted(names)})
