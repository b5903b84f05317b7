from typing import Any

from django.db import migrations, models

from controlplane.changes import triggers


def install(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(triggers.POSTGRESQL)
    # SQLite: installed after every migrate by the app's post_migrate handler (apps.py), since
    # a later migration's table rebuild fails while triggers name the table


def uninstall(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(triggers.POSTGRESQL_DROP)
    elif schema_editor.connection.vendor == "sqlite":
        for name in triggers.SQLITE_NAMES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("applications", "0002_application_description_application_store_url_and_more"),
        ("jobs", "0002_initial"),
        ("lineage", "0002_graph_links_cascade"),
        ("operations", "0002_align_hotswap_kinds"),
    ]

    operations = [
        migrations.CreateModel(
            name="Change",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=100)),
            ],
            options={
                "indexes": [models.Index(fields=["key", "-id"], name="change_key_recent")],
            },
        ),
        migrations.RunPython(install, uninstall),
    ]
