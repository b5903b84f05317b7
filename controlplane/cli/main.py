"""The `epochal` console command: `epochal --help` lists the verbs, one line each.

It configures Django itself (`controlplane.settings`, whose defaults — SQLite and the store
under the project's `var/` — are found from the installed package, as `manage.py` finds them),
so it works from any directory once the project is installed (`bin/setup`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from controlplane.cli.console import CliError, Console, refusal
from controlplane.cli.verb import Verb
from controlplane.errors import EpochalError


def verbs() -> tuple[Verb, ...]:
    """Every verb, in the order `--help` lists them (imported once Django is set up)."""
    from controlplane.cli.jobfiles import VERBS as JOB_FILE_VERBS
    from controlplane.cli.jobs import VERBS as JOB_VERBS
    from controlplane.cli.operations import VERBS as OPERATION_VERBS
    from controlplane.cli.store import STORE
    from controlplane.cli.stores import VERBS as STORE_VERBS
    from controlplane.cli.tokens import TOKEN

    return (*JOB_VERBS, *JOB_FILE_VERBS, *OPERATION_VERBS, STORE, *STORE_VERBS, TOKEN)


def verb_named(name: str) -> Verb:
    return next(verb for verb in verbs() if verb.name == name)


def add_verb_arguments(verb: Verb, parser: argparse.ArgumentParser) -> None:
    """The verb's arguments, plus `--json` where it offers one."""
    verb.add_arguments(parser)
    if verb.json:
        parser.add_argument("--json", action="store_true", help="machine-readable output")


class _OneLinePerVerb(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=16, width=110)
        # argparse measures the verbs one indent short; room for `savepoint` and `operation`
        self._action_max_length = 14


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epochal",
        formatter_class=_OneLinePerVerb,
        description="Run Epochal's streaming jobs from a shell: jobs, operations, the store.",
        epilog="Configured like the control plane, from the environment (DATABASE_URL, "
        "STORE_URL …). `epochal VERB --help` describes a verb. Exit status: 0 ok, 1 refused "
        "or failed, 2 bad usage.",
    )
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in verbs():
        child = sub.add_parser(
            verb.name, help=verb.help, description=verb.help[:1].upper() + verb.help[1:] + "."
        )
        add_verb_arguments(verb, child)
        child.set_defaults(run=verb.run)
    return parser


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; returns the exit status."""
    setup_django()
    args = build_parser().parse_args(argv)
    console = Console(sys.stdout, sys.stderr, as_json=bool(getattr(args, "json", False)))
    try:
        return int(args.run(args, console))
    except CliError as exc:
        sys.stderr.write(f"epochal {args.verb}: {exc.message}\n")
        return exc.status
    except EpochalError as exc:
        sys.stderr.write(f"epochal {args.verb}: {refusal(exc)}\n")
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (the operation, if any, goes on: `epochal operation`)\n")
        return 130


def entry_point() -> None:
    """`[project.scripts] epochal`."""
    raise SystemExit(main())
