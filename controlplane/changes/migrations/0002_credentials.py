"""Change records for API tokens and users (what a token's authentication depends on)."""

from typing import Any

from django.db import migrations

from controlplane.changes import triggers


def install(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(triggers.POSTGRESQL_CREDENTIALS)
    # SQLite: installed after every migrate by the app's post_migrate handler (apps.py)


def uninstall(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(triggers.POSTGRESQL_CREDENTIALS_DROP)
    elif schema_editor.connection.vendor == "sqlite":
        for name in triggers.SQLITE_CREDENTIALS_NAMES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("changes", "0001_initial"),
        ("accounts", "0003_hash_plain_tokens"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(install, uninstall)]
