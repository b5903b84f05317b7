from django.db import migrations, models

# The columns are added with ALTER TABLE … ADD COLUMN on both vendors. Django's own AddField of
# a NOT NULL column remakes the table on SQLite (copy, drop, rename), which the change-feed
# triggers of other tables that name jobs_job do not survive ("no such table: main.jobs_job").
COLUMNS = (
    ("savepoint_interval_s", 0),
    ("savepoint_retention", 5),
)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0006_run_watch"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'ALTER TABLE "jobs_job" ADD COLUMN "{name}" integer NOT NULL '
                    f'DEFAULT {default} CHECK ("{name}" >= 0)',
                    f'ALTER TABLE "jobs_job" DROP COLUMN "{name}"',
                )
                for name, default in COLUMNS
            ],
            state_operations=[
                migrations.AddField(
                    model_name="job",
                    name="savepoint_interval_s",
                    field=models.PositiveIntegerField(default=0),
                ),
                migrations.AddField(
                    model_name="job",
                    name="savepoint_retention",
                    field=models.PositiveIntegerField(default=5),
                ),
            ],
        ),
    ]
