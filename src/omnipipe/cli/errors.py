"""``CLIError``: a mistake the user can fix, which the ``omnipipe`` command prints as one line with exit code 2."""

from __future__ import annotations


class CLIError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""
