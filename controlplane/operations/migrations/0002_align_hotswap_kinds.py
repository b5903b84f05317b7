"""Operation kinds align and hotswap (job webs)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="operation",
            name="kind",
            field=models.CharField(
                choices=[
                    ("start", "Start"),
                    ("stop", "Stop"),
                    ("savepoint", "Savepoint"),
                    ("rescale", "Rescale"),
                    ("rollback", "Rollback"),
                    ("fork", "Fork"),
                    ("migrate", "Migrate"),
                    ("align", "Align"),
                    ("hotswap", "Hotswap"),
                ],
                max_length=16,
            ),
        ),
    ]
