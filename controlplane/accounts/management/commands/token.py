"""`manage.py token USERNAME [--list | --rotate [PREFIX] | --revoke PREFIX]`: the same as
`epochal token` (controlplane/cli/tokens.py)."""

from controlplane.cli.management import verb_command

Command = verb_command("token")
