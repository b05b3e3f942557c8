"""Options of the soak (pytest tests/soak -m slow --soak-seconds 180)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("soak")
    group.addoption("--soak-seconds", type=float, default=1800.0,
                    help="length of the soak in seconds (default 1800; warm-up is a fifth, at most 300 s)")
    group.addoption("--soak-workers", type=int, default=2, help="fd-serve --workers of the soaked server")
    group.addoption("--soak-clients", type=int, default=8, help="concurrent client loops")
