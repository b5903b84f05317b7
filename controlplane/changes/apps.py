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

    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        for name in triggers.SQLITE_NAMES:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name}")


def _install_sqlite_triggers(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """Put the triggers back once migrations ran (when the changes app's migration is in)."""
    from django.db.migrations.recorder import MigrationRecorder

    from controlplane.changes import triggers

    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    if not MigrationRecorder(connection).migration_qs.filter(app="changes").exists():
        return
    with connection.cursor() as cursor:
        for name in triggers.SQLITE_NAMES:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
        for statement in triggers.SQLITE:
            cursor.execute(statement)
