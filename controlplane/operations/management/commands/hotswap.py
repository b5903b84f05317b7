"""`manage.py hotswap`: the same as `epochal hotswap` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("hotswap")
