"""`manage.py register`: the same as `epochal register` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("register")
