"""User-facing errors.

Every error a user can cause (a damaged snapshot, a wrong model path, a bad config value) is one of
these, so the CLI can print a single line and exit with :data:`EXIT_BAD_INPUT` instead of a
traceback, and library callers can catch one type.
"""

from __future__ import annotations

import os

EXIT_OK = 0
"""Success; for ``--verify`` also: the snapshot is intact."""
EXIT_FAILURE = 1
"""An unexpected failure (a bug, an engine crash): not the user's input."""
EXIT_USAGE = 2
"""Bad command-line usage (argparse's own convention)."""
EXIT_BAD_INPUT = 3
"""The input is bad: damaged or mismatched snapshot, wrong model or tokenizer, bad config value."""


class PartialRolloutError(Exception):
    """Base class of errors caused by the user's input, not by a bug."""


class BadInputError(PartialRolloutError, ValueError):
    """Input that cannot be used, with the file and the field it concerns.

    The message reads ``<file>: <field>: <what is wrong>. <how to fix it>`` so one line tells the
    user where to look.
    """

    def __init__(
        self,
        what: str,
        *,
        path: str | os.PathLike[str] | None = None,
        field: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.path = None if path is None else os.fspath(path)
        self.field = field
        self.what = what
        self.fix = fix
        parts = [p for p in (self.path, field) if p]
        head = ": ".join(parts)
        message = f"{head}: {what}" if head else what
        if fix:
            message = f"{message.rstrip('.')}. {fix}"
        super().__init__(message)


class SnapshotError(BadInputError):
    """A snapshot file that is damaged, truncated, of an unknown version, or mismatched."""


class ConfigError(BadInputError):
    """A configuration value (engine, trainer, model) that cannot be used."""
