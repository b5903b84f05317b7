"""`manage.py register_store`: the same as `epochal register-store` (controlplane/cli)."""

from controlplane.cli.management import verb_command

Command = verb_command("register-store")
