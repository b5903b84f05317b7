"""`manage.py migrate_job`: the same as `epochal migrate` (`migrate` is Django's schema command)."""

from controlplane.cli.management import verb_command

Command = verb_command("migrate")
