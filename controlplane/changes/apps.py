from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import post_migrate, pre_migrate


class ChangesConfig(AppConfig):
    name = "controlplane.changes"
    label = "changes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        pre_migrate.connect(_drop_sqlite_triggers, sender=self)
        post_migrate.connect(_install_sqlite_triggers, sender=self)


def _drop_sqlite_triggers(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """SQLite rebuilds a table to alter it (copy, drop, rename); a trigger on another table
    that names it then fails the rebuild ("no such table"). Migrations run without them."""
    from controlplane.changes import triggers
    from controlplane.jobs import summaries

    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        names = [*triggers.SQLITE_NAMES, *triggers.SQLITE_CREDENTIALS_NAMES]
        for name in [*names, *summaries.SQLITE_NAMES]:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name}")


def _install_sqlite_triggers(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """Put the triggers back once migrations ran (when the changes app's migration is in)."""
    from django.db.migrations.recorder import MigrationRecorder

    from controlplane.changes import triggers
    from controlplane.jobs import summaries

    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    applied = MigrationRecorder(connection).migration_qs
    sets = []
    if applied.filter(app="changes").exists():
        sets.append((triggers.SQLITE_NAMES, triggers.SQLITE))
    if applied.filter(app="changes", name="0002_credentials").exists():
        sets.append((triggers.SQLITE_CREDENTIALS_NAMES, triggers.SQLITE_CREDENTIALS))
    if applied.filter(app="jobs", name="0005_job_summary").exists():  # and the job summaries
        sets.append((summaries.SQLITE_NAMES, summaries.SQLITE))
    with connection.cursor() as cursor:
        for names, statements in sets:
            for name in names:
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
            for statement in statements:
                cursor.execute(statement)
