"""`manage.py savepoint`: the same as `epochal savepoint` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("savepoint")
