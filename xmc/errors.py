"""Errors the pipeline reports to a person as one line."""

from __future__ import annotations

from pathlib import Path


class XMCError(Exception):
    """Base class: the message is meant to be printed as a single line."""


class DataFormatError(XMCError):
    """A malformed input file. ``str()`` gives ``path:line: message``."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = " ".join(str(message).split())  # one line, whatever the underlying error printed
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {self.message}")


class ValidationFailed(XMCError):
    """A critical data-validation expectation failed."""


class ConfigError(XMCError):
    """A parameter or path in params.yaml is wrong."""
