"""Errors every service reports the same way."""

from __future__ import annotations

__all__ = ["SetupError"]


class SetupError(ValueError):
    """What the process was given cannot be used: a setting's value, or a file or address a
    setting names (a kubeconfig, a proxy URL). The message says which and why; a service that
    meets one while starting logs that one line and exits with code 2, without a traceback."""
