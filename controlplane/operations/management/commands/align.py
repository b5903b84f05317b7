"""`manage.py align`: the same as `epochal align` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("align")
