"""`manage.py jobs`: the same as `epochal jobs` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("jobs")
