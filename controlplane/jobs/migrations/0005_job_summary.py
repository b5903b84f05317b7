"""Job summaries kept by the database (controlplane/jobs/summaries.py)."""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

from controlplane.jobs import summaries


def install(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute(summaries.BACKFILL)
    schema_editor.execute(summaries.REFRESH_ALL)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(summaries.POSTGRESQL)
    # SQLite: installed after every migrate (controlplane/changes/apps.py)


def uninstall(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(summaries.POSTGRESQL_DROP)
    elif schema_editor.connection.vendor == "sqlite":
        for name in summaries.SQLITE_NAMES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_job_spark_conf"),
        ("lineage", "0002_graph_links_cascade"),
        ("operations", "0004_operation_target_branch"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobSummary",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="summary",
                        serialize=False,
                        to="jobs.job",
                    ),
                ),
                (
                    "active_operation",
                    models.ForeignKey(
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="operations.operation",
                    ),
                ),
                (
                    "head",
                    models.ForeignKey(
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="lineage.snapshot",
                    ),
                ),
                (
                    "latest_run",
                    models.ForeignKey(
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="jobs.run",
                    ),
                ),
            ],
        ),
        migrations.RunPython(install, uninstall),
    ]
