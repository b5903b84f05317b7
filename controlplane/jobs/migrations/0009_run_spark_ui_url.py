from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0008_merge_patterns_and_savepoints")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="spark_ui_url",
            field=models.CharField(blank=True, max_length=300, null=True),
        ),
    ]
