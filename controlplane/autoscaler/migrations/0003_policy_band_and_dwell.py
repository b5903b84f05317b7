"""The policy's hold band (`utilisation_min`, `utilisation_max`) and `min_dwell_s`
(docs/autoscaling.md). A policy whose target is above the new default `utilisation_max` gets
its target as the maximum, so every stored policy stays valid."""

from typing import Any

from django.db import migrations, models
from django.db.models import F


def band_covers_target(apps: Any, schema_editor: Any) -> None:
    policy = apps.get_model("autoscaler", "AutoscalePolicy")
    policy.objects.filter(target_utilisation__gt=F("utilisation_max")).update(
        utilisation_max=F("target_utilisation")
    )
    policy.objects.filter(utilisation_min__gte=F("target_utilisation")).update(utilisation_min=0.0)


class Migration(migrations.Migration):
    dependencies = [("autoscaler", "0002_job_change_triggers")]

    operations = [
        migrations.AddField(
            model_name="autoscalepolicy",
            name="utilisation_min",
            field=models.FloatField(default=0.4),
        ),
        migrations.AddField(
            model_name="autoscalepolicy",
            name="utilisation_max",
            field=models.FloatField(default=0.9),
        ),
        migrations.AddField(
            model_name="autoscalepolicy",
            name="min_dwell_s",
            field=models.FloatField(default=60.0),
        ),
        migrations.RunPython(band_covers_target, migrations.RunPython.noop),
    ]
