"""`manage.py start`: the same as `epochal start` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("start")
