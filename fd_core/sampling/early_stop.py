"""FastDeploy's repetition early stop (``--enable-early-stop``, ``--early-stop-config``).

A request stops (finish_reason ``"stop"``) once the probability of its
chosen token has been above ``threshold`` for ``window_size`` consecutive
steps: the model is stuck repeating what it is sure of. As FastDeploy's
``RepetitionEarlyStopper``: the probability is the softmax of the logits the
sampler draws from (after logit_bias, bans, logits processors, penalties and
temperature; before min-p / top-k / top-p; greedy rows unscaled), and the
comparison is strict (``p > threshold``). The token of the step that
triggers is kept. Per request: a counter of consecutive confident steps in
its ``SamplingState``, so the cost is one logsumexp over the step's logits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EarlyStopConfig"]

STRATEGIES = ("repetition",)
_KEYS = ("enable_early_stop", "strategy", "window_size", "threshold")


@dataclass(frozen=True)
class EarlyStopConfig:
    """FastDeploy's EarlyStopConfig fields and defaults."""

    strategy: str = "repetition"
    window_size: int = 3000  # consecutive confident steps that stop a request
    threshold: float = 0.99  # a step is confident when p(token) > threshold

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"--early-stop-config strategy must be one of {', '.join(STRATEGIES)}, "
                f"got {self.strategy!r}"
            )
        w = self.window_size
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            raise ValueError(f"--early-stop-config window_size must be an integer >= 1, got {w!r}")
        t = self.threshold
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 < t < 1:
            raise ValueError(f"--early-stop-config threshold must be in (0, 1), got {t!r}")

    @classmethod
    def from_args(
        cls, enable_early_stop: bool, config: Mapping[str, Any] | str | None
    ) -> EarlyStopConfig | None:
        """The config when early stop is on, else None.

        ``config`` is ``--early-stop-config``: a dict or its JSON text with
        any of ``strategy``, ``window_size``, ``threshold`` and
        ``enable_early_stop`` (FastDeploy lets the config switch it on too).
        Unknown keys are refused by name.
        """
        if isinstance(config, str):
            try:
                config = json.loads(config)
            except json.JSONDecodeError as e:
                raise ValueError(f"--early-stop-config must be a JSON object: {e}") from e
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise ValueError(f"--early-stop-config must be a JSON object, got {config!r}")
        unknown = sorted(set(config) - set(_KEYS))
        if unknown:
            raise ValueError(
                f"--early-stop-config: unknown key(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(_KEYS)}"
            )
        enabled = config.get("enable_early_stop", enable_early_stop) or enable_early_stop
        if not isinstance(enabled, bool):
            raise ValueError(f"--early-stop-config enable_early_stop must be a bool, got {enabled!r}")
        settings = {k: v for k, v in config.items() if k != "enable_early_stop"}
        made = cls(**settings)  # validates even when off, so a typo fails at start-up
        return made if enabled else None
