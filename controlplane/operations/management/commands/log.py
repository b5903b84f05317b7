"""`manage.py log`: the same as `epochal log` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("log")
