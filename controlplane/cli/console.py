"""Where the CLI writes: tables for people, JSON for scripts, errors that say what to do."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO

from controlplane.errors import EpochalError


class CliError(Exception):
    """A refused command: `message` says what is wrong and what to do; `status` is the exit code."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def refusal(exc: EpochalError) -> str:
    """A domain error as one line: its message, then the fields it names."""
    return f"{exc.message} {exc.fields}" if exc.fields else exc.message


class Console:
    """`line` and `table` for people, `json` for scripts; `note` for progress and hints."""

    def __init__(self, stdout: TextIO, stderr: TextIO, *, as_json: bool = False) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.as_json = as_json

    def line(self, text: str = "") -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def note(self, text: str) -> None:
        """Progress and hints: stdout for people, stderr when stdout carries JSON."""
        stream = self.stderr if self.as_json else self.stdout
        stream.write(text + "\n")
        stream.flush()

    def json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")
        self.stdout.flush()

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Columns as wide as their widest cell; the last column is not padded."""
        cells = [
            [str(h) for h in headers],
            *[["" if c is None else str(c) for c in r] for r in rows],
        ]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        for row in cells:
            padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
            self.line("  ".join([*padded, row[-1]]).rstrip())
        if not rows:
            self.line("(none)")
