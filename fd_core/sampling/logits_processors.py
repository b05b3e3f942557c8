"""Pluggable logits processors: ``--logits-processors`` and ``logits_processors_args``.

The engine loads each class named by ``--logits-processors`` once, at
start (``load_logits_processors``), constructing it with the engine's facts
(``LogitsProcessorContext``). A request switches a processor on by naming
one of its ``arg_keys`` in ``SamplingParams.logits_processors_args``; a key
that no loaded processor reads is refused when the request is added
(``check_request_args``), so nothing a client sends is silently ignored.

Every step the sampler calls, for each loaded processor that at least one
row switched on, ``update_state(rows)`` then ``apply(logits)``
(FastDeploy's and vLLM v1's order); a processor no row uses costs nothing.
Processors run after ``logit_bias`` and bans and before the penalties and
temperature (see ``fd_core.sampling.sampler``).

Specs: ``"pkg.module:Class"`` or ``"pkg.module.Class"``; a bare name (or
FastDeploy's module ``fastdeploy.model_executor.logits_processor``) means a
built-in of this module, so FastDeploy's ``LogitBiasLogitsProcessor`` works
as written.
"""

from __future__ import annotations

import abc
import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fd_core._paddle import import_paddle

if TYPE_CHECKING:
    from fd_core.sampling.sampler import SamplingState

__all__ = [
    "LogitBiasLogitsProcessor",
    "LogitsProcessor",
    "LogitsProcessorContext",
    "apply_logits_processors",
    "check_request_args",
    "load_logits_processors",
]

paddle = import_paddle()
Tensor = Any

_FASTDEPLOY_MODULE = "fastdeploy.model_executor.logits_processor"


@dataclass(frozen=True)
class LogitsProcessorContext:
    """What a processor may know about the engine when it is built."""

    vocab_size: int  # logits columns the sampler passes (vocabulary padding cut off)
    device_type: str  # the backend's paddle device type: "cpu", "gpu", "xpu", ...


class LogitsProcessor(abc.ABC):
    """One kind of per-request logits change, loaded once per engine.

    Subclasses set ``arg_keys`` (the ``logits_processors_args`` names they
    read) and implement ``apply``; override ``validate_args`` to refuse bad
    values at admission and ``update_state`` to gather per-step state.
    """

    arg_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, context: LogitsProcessorContext) -> None:
        self.context = context
        self.rows: list[SamplingState | None] = []

    def validate_args(self, args: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Check one request's ``logits_processors_args`` when it is added
        (only called when it names one of ``arg_keys``); raise ValueError
        naming the bad argument."""

    def update_state(self, rows: Sequence[SamplingState | None]) -> None:
        """Called before ``apply`` each step: ``rows[i]`` is the state of the
        request owning logits row ``i`` when it switched this processor on,
        else None. The default keeps them in ``self.rows``."""
        self.rows = list(rows)

    @abc.abstractmethod
    def apply(self, logits: Tensor) -> Tensor:
        """Return the changed ``logits [N, V]`` (fp32); rows whose entry in
        ``rows`` is None must come back unchanged."""

    def is_argmax_invariant(self) -> bool:
        """True when the processor never changes a greedy row's argmax."""
        return False


def _token_id(key: Any) -> int | None:
    try:
        token = int(key) if isinstance(key, str) else key
    except ValueError:
        return None
    return token if isinstance(token, int) and not isinstance(token, bool) else None


MAX_BIAS = 1e9  # |bias| above this could overflow float32 logits (1e39 -> inf -> NaN probabilities)


class LogitBiasLogitsProcessor(LogitsProcessor):
    """FastDeploy's built-in: ``{"logit_bias": {token id: bias}}`` adds each
    bias to its token's logit (JSON keys may be numeric strings)."""

    arg_keys = ("logit_bias",)

    def validate_args(self, args: Mapping[str, Any]) -> None:
        bias = args["logit_bias"]
        if not isinstance(bias, Mapping):
            raise ValueError(
                f"logits_processors_args.logit_bias must be a dict of token id -> bias, got {bias!r}"
            )
        vocab = self.context.vocab_size
        for key, value in bias.items():
            token = _token_id(key)
            if token is None or not 0 <= token < vocab:
                raise ValueError(
                    f"logits_processors_args.logit_bias keys must be token ids in [0, {vocab}), "
                    f"got {key!r}"
                )
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value) or abs(value) > MAX_BIAS):
                raise ValueError(
                    f"logits_processors_args.logit_bias values must be numbers in [-{MAX_BIAS:g}, "
                    f"{MAX_BIAS:g}], got {value!r} for token {key!r}"
                )

    def apply(self, logits: Tensor) -> Tensor:
        rows, tokens, values = [], [], []
        for i, state in enumerate(self.rows):
            if state is None:
                continue
            bias = (state.params.logits_processors_args or {}).get("logit_bias") or {}
            for key, value in bias.items():
                rows.append(i)
                tokens.append(_token_id(key))
                values.append(float(value))
        if not rows:
            return logits
        index = paddle.to_tensor(np.stack([np.asarray(rows, np.int64), np.asarray(tokens, np.int64)], 1))
        return paddle.scatter_nd_add(logits, index, paddle.to_tensor(np.asarray(values, np.float32)))


def _resolve(spec: str) -> Any:
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--logits-processors: expected 'pkg.module:Class', got {spec!r}")
    spec = spec.strip()
    if ":" in spec:
        module_name, _, name = spec.partition(":")
    elif "." in spec:
        module_name, _, name = spec.rpartition(".")
    else:
        module_name, name = __name__, spec
    if module_name == _FASTDEPLOY_MODULE:
        module_name = __name__
    if not module_name or not name:
        raise ValueError(f"--logits-processors: expected 'pkg.module:Class', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--logits-processors {spec!r}: cannot import module {module_name!r}: {e}") from e
    try:
        return getattr(module, name)
    except AttributeError:
        raise ValueError(
            f"--logits-processors {spec!r}: module {module_name!r} has no attribute {name!r}"
        ) from None


def load_logits_processors(
    specs: Sequence[str] | None, context: LogitsProcessorContext
) -> list[LogitsProcessor]:
    """Import and build each processor class named in ``specs``; ValueError
    naming the spec when it cannot be imported, is not a ``LogitsProcessor``
    subclass, reads no arguments, or shares an argument name with another."""
    processors: list[LogitsProcessor] = []
    owners: dict[str, str] = {}
    for spec in specs or []:
        cls = _resolve(spec)
        if not (isinstance(cls, type) and issubclass(cls, LogitsProcessor)):
            raise ValueError(
                f"--logits-processors {spec!r} is not a logits processor: expected a subclass of "
                f"fd_core.sampling.logits_processors.LogitsProcessor, got {cls!r}"
            )
        keys = tuple(cls.arg_keys)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise ValueError(
                f"--logits-processors {spec!r}: {cls.__name__}.arg_keys must name the "
                f"logits_processors_args it reads, got {cls.arg_keys!r}"
            )
        for key in keys:
            if key in owners:
                raise ValueError(
                    f"--logits-processors: {spec!r} and {owners[key]!r} both read "
                    f"logits_processors_args key {key!r}"
                )
            owners[key] = spec
        processors.append(cls(context))
    return processors


def check_request_args(processors: Sequence[LogitsProcessor], args: Mapping[str, Any] | None) -> None:
    """Refuse (ValueError) ``logits_processors_args`` keys no loaded processor
    reads, and values the processors reject."""
    if not args:
        return
    known = {key for p in processors for key in p.arg_keys}
    unknown = sorted(set(args) - known)
    if unknown:
        loaded = ", ".join(sorted(known)) or "none: no processor is loaded"
        raise ValueError(
            f"logits_processors_args key(s) {', '.join(map(repr, unknown))} are read by no loaded "
            f"logits processor (keys read: {loaded}); start the server with --logits-processors "
            "(offline: LLM(logits_processors=[...])) naming a processor that reads them"
        )
    for p in processors:
        if any(key in args for key in p.arg_keys):
            p.validate_args(args)


def apply_logits_processors(
    processors: Sequence[LogitsProcessor], logits: Tensor, states: Sequence[SamplingState]
) -> Tensor:
    """Run each processor some row switched on over ``logits [N, V]``.

    The first active processor gets a copy, so one that changes its input in
    place cannot reach the caller's tensor (the raw logits of logprobs)."""
    copied = False
    for p in processors:
        rows = [s if s.params.logits_processors_args and any(
            k in s.params.logits_processors_args for k in p.arg_keys) else None for s in states]
        if all(r is None for r in rows):
            continue
        if not copied:
            logits, copied = logits.clone(), True
        p.update_state(rows)
        logits = p.apply(logits)
    return logits
