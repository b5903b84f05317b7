"""A verb of the `epochal` command: its arguments and what it does (one implementation each)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.cli.console import Console


@dataclass(frozen=True)
class Verb:
    name: str
    help: str
    """One line: what `epochal --help` lists."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Console], int]
    """Returns the exit status; raises `CliError` (or a domain error) when refused."""
    json: bool = True
    """Whether the verb offers `--json`."""
