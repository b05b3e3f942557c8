"""Errors shared across fd_core's layers (a leaf module: it imports nothing of fd_core)."""

from __future__ import annotations

__all__ = ["UnsupportedFeatureError"]


class UnsupportedFeatureError(ValueError):
    """A flag names a feature that is not implemented (yet)."""
