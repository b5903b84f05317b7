"""Places only from admin-registered stores: a Store registry; applications name one.

An application that had a `store_url` (set by an earlier migrate copy), or whose jobs had one,
gets a registered store with that URL, named after the application, so existing deployments
keep reading and writing where they did. Review them in the admin: a `file://` store outside
EPOCHAL_STORE_ROOTS can no longer be registered anew.
"""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


def _store_for(Store, url, name):
    store = Store.objects.filter(url=url).first()
    if store is not None:
        return store
    candidate, n = name, 1
    while Store.objects.filter(name=candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return Store.objects.create(
        name=candidate, url=url, description="registered from the application's store_url"
    )


def register_store_urls(apps, schema_editor):
    Application = apps.get_model("applications", "Application")
    Store = apps.get_model("applications", "Store")
    Job = apps.get_model("jobs", "Job")
    for application in Application.objects.all():
        urls = {application.store_url} - {""}
        jobs = set(
            Job.objects.filter(application=application)
            .exclude(store_url="")
            .values_list("store_url", flat=True)
        )
        if len(jobs) > 1 or (jobs and urls and jobs != urls):
            raise RuntimeError(
                f"jobs of application {application.name} use different stores "
                f"({sorted(urls | jobs)}); an application has one store now: move them "
                "to one (migrate copy) before upgrading"
            )
        url = next(iter(urls or jobs), "")
        if url:
            application.store_id = _store_for(Store, url, application.name).pk
            application.save(update_fields=["store"])


def restore_store_urls(apps, schema_editor):
    Application = apps.get_model("applications", "Application")
    for application in Application.objects.exclude(store=None).select_related("store"):
        application.store_url = application.store.url
        application.save(update_fields=["store_url"])


class Migration(migrations.Migration):

    dependencies = [
        ('applications', '0003_version_job_entry_point'),
        ('jobs', '0002_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='Store',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True, validators=[django.core.validators.RegexValidator('^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$')])),
                ('url', models.CharField(max_length=1000, unique=True)),
                ('credentials_env', models.CharField(blank=True, default='', help_text="Environment variable prefix the store's credentials come from (<PREFIX>_AWS_ACCESS_KEY_ID, <PREFIX>_AWS_SECRET_ACCESS_KEY); never the secret.", max_length=100, validators=[django.core.validators.RegexValidator('^[A-Za-z_][A-Za-z0-9_]{0,99}$', 'an environment variable name')])),
                ('credentials_secret', models.CharField(blank=True, default='', help_text="Kubernetes secret holding the store's credentials, mounted into job pods.", max_length=253, validators=[django.core.validators.RegexValidator('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$', 'a Kubernetes secret name')])),
                ('description', models.TextField(blank=True, default='')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.AddField(
            model_name='application',
            name='store',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='applications', to='applications.store'),
        ),
        migrations.RunPython(register_store_urls, restore_store_urls),
        migrations.RemoveField(
            model_name='application',
            name='store_url',
        ),
    ]
