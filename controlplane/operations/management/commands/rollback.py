"""`manage.py rollback`: the same as `epochal rollback` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("rollback")
