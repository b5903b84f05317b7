"""Declarative jobs from a shell: `epochal export`, `epochal diff -f F`, `epochal apply -f F`."""

from __future__ import annotations

import argparse
import sys

from controlplane.cli.console import CliError, Console
from controlplane.cli.verb import Verb
from controlplane.jobfiles import document
from controlplane.jobfiles.document import JobEntry
from controlplane.jobfiles.plan import apply, export, plan


def _file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--file", required=True, help="the job file (YAML; `-` reads standard input)"
    )


def _entries(path: str) -> list[JobEntry]:
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
    except OSError as exc:
        raise CliError(f"cannot read the job file {path}: {exc.strerror}") from None
    return document.parse(document.load(text))


def _run_diff(args: argparse.Namespace, console: Console) -> int:
    changes = plan(_entries(args.file))
    if console.as_json:
        console.json([change.to_dict() for change in changes])
        return 0
    for change in changes:
        console.line(change.describe())
    if not changes:
        console.line("no changes: the jobs are as the file says")
    return 0


def _run_apply(args: argparse.Namespace, console: Console) -> int:
    outcomes = apply(_entries(args.file), user=None, via="cli")
    status = 1 if any(o.outcome == "refused" for o in outcomes) else 0  # the rest was made
    if console.as_json:
        console.json([outcome.to_dict() for outcome in outcomes])
        return status
    for outcome in outcomes:
        operation = f" (operation {outcome.operation})" if outcome.operation else ""
        detail = f": {outcome.detail}" if outcome.detail else ""
        console.line(f"{outcome.change.describe()}: {outcome.outcome}{operation}{detail}")
    if not outcomes:
        console.line("no changes: the jobs are as the file says")
    elif any(o.outcome == "waits" for o in outcomes):
        console.note("a job has an operation running: apply the file again when it ends")
    return status


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--application", help="only this application's jobs")


def _run_export(args: argparse.Namespace, console: Console) -> int:
    console.stdout.write(document.dump(export(application=args.application)))
    return 0


EXPORT = Verb(
    "export",
    "today's jobs as a job file (YAML) to keep in git",
    _export_arguments,
    _run_export,
    False,
)
DIFF = Verb(
    "diff", "what applying a job file would change, as operations", _file_argument, _run_diff
)
APPLY = Verb(
    "apply", "make the jobs as a job file says, by ordinary operations", _file_argument, _run_apply
)
VERBS = (EXPORT, DIFF, APPLY)
