"""Versions name their job by entry-point name (group epochal.jobs), not by module:attr.

Existing versions that named a job by ``module:attr`` are rewritten to the entry-point name
an installed package registers for that same ``module:attr``. A reference no installed
package registers is left as it was: launching it fails with a message naming the version
and how to register the job (docs/security.md#code-and-places), and an admin replaces the
version with one naming a registered job.
"""

import django.core.validators
from django.db import migrations, models

KNOWN = {
    "runners.jobs.clickstream:job": "clickstream",
    "runners.jobs.fraud:job": "fraud",
    "runners.jobs.web_totals:job": "web-totals",
}


def _registered() -> dict[str, str]:
    from runners import entry_points

    names = dict(KNOWN)
    for found in entry_points.registered(entry_points.JOBS):
        names.setdefault(found.value, found.name)
    return names


def to_entry_points(apps, schema_editor):
    ApplicationVersion = apps.get_model("applications", "ApplicationVersion")
    names = _registered()
    for version in ApplicationVersion.objects.filter(job__contains=":"):
        if version.job in names:
            version.job = names[version.job]
            version.save(update_fields=["job"])


def to_references(apps, schema_editor):
    ApplicationVersion = apps.get_model("applications", "ApplicationVersion")
    values = {name: value for value, name in _registered().items()}
    for version in ApplicationVersion.objects.exclude(job__contains=":"):
        if version.job in values:
            version.job = values[version.job]
            version.save(update_fields=["job"])


class Migration(migrations.Migration):
    dependencies = [
        ("applications", "0002_application_description_application_store_url_and_more"),
    ]

    operations = [
        migrations.AlterField(
            model_name="applicationversion",
            name="job",
            field=models.CharField(
                max_length=255,
                validators=[
                    django.core.validators.RegexValidator(
                        "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
                        "a job is named by its entry-point name (epochal.jobs)",
                    )
                ],
            ),
        ),
        migrations.RunPython(to_entry_points, to_references),
    ]
