"""`manage.py fork`: the same as `epochal fork` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("fork")
