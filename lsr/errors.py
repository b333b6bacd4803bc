"""Errors whose kind the command line reports by its exit code (lsr.cli): library code raises them, so that no
stage package imports the command line."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A bad option or config value: exit code 2."""
