"""`manage.py rescale`: the same as `epochal rescale` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("rescale")
