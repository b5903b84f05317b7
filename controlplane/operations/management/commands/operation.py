"""`manage.py operation`: the same as `epochal operation` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("operation")
