"""`manage.py stop`: the same as `epochal stop` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("stop")
