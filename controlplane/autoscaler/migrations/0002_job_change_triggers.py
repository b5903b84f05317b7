"""A new autoscaler decision or a policy change is a change of its job (the job page's live
parts and `?watch=` follow `job:<id>`, see controlplane/changes)."""

from typing import Any

from django.db import migrations

TABLES = ("autoscaler_autoscaledecision", "autoscaler_autoscalepolicy")

POSTGRESQL = """
CREATE OR REPLACE FUNCTION changes_autoscaler() RETURNS trigger AS $$
BEGIN
    PERFORM changes_note('job:' || NEW.job_id);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
""" + "".join(
    f"CREATE TRIGGER changes_{t} AFTER INSERT OR UPDATE ON {t} "
    "FOR EACH ROW EXECUTE FUNCTION changes_autoscaler();\n"
    for t in TABLES
)
POSTGRESQL_DROP = "".join(f"DROP TRIGGER IF EXISTS changes_{t} ON {t};\n" for t in TABLES) + (
    "DROP FUNCTION IF EXISTS changes_autoscaler();"
)
SQLITE = [
    f"CREATE TRIGGER changes_{t}_{e} AFTER {e.upper()} ON {t} BEGIN "
    "INSERT INTO changes_change(key) VALUES ('job:' || NEW.job_id); END"
    for t in TABLES
    for e in ("insert", "update")
]


def install(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE:
            schema_editor.execute(statement)


def uninstall(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_DROP)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {statement.split()[2]}")


class Migration(migrations.Migration):
    dependencies = [
        ("autoscaler", "0001_initial"),
        ("changes", "0001_initial"),
    ]

    operations = [migrations.RunPython(install, uninstall)]
