"""For migrations that rebuild a table on SQLite (it alters by copy, drop and rename): the
change triggers (controlplane/changes/triggers.py) name those tables, so they are dropped
before the rebuild and created again after it. PostgreSQL alters in place: nothing to do."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from controlplane.changes import triggers


def _off(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "sqlite":
        for name in triggers.SQLITE_NAMES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


def _on(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    # Before the changes app's first migration there are no triggers yet: it installs them.
    if connection.vendor == "sqlite" and "changes_change" in connection.introspection.table_names():
        for statement in triggers.SQLITE:
            schema_editor.execute(statement)


def around(*operations: Any) -> list[Any]:
    """`operations` with the SQLite change triggers dropped before and created after."""
    return [
        migrations.RunPython(_off, _on),
        *operations,
        migrations.RunPython(_on, _off),
    ]
