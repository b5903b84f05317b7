from typing import Any

from django import forms
from django.contrib import admin

from controlplane.applications.models import Application, ApplicationVersion, Sink, Store
from controlplane.jobs.services import version_config_errors
from runners import entry_points


@admin.register(Store)
class StoreAdmin(admin.ModelAdmin):
    """The store registry: the only places operations may name (file:// under
    EPOCHAL_STORE_ROOTS, checked by the model's clean)."""

    list_display = ["name", "shown_url", "credentials_env", "credentials_secret", "created_at"]
    search_fields = ["name", "url"]
    readonly_fields = ["created_at"]


@admin.register(Sink)
class SinkAdmin(admin.ModelAdmin):
    """The sink registry: the only destinations versions may name (config checked by the
    destination and against EPOCHAL_SINK_ROOTS / EPOCHAL_SINK_HOSTS in the model's clean)."""

    list_display = ["name", "kind", "credentials_env", "credentials_secret", "created_at"]
    search_fields = ["name", "kind"]
    readonly_fields = ["created_at"]


@admin.register(Application)
class ApplicationAdmin(admin.ModelAdmin):
    list_display = ["name", "store", "store_namespace", "max_parallelism", "created_at"]
    search_fields = ["name", "store_namespace"]
    readonly_fields = ["created_at"]


class VersionForm(forms.ModelForm):
    """A version's job is one of the entry points installed packages register (epochal.jobs)."""

    job = forms.ChoiceField(
        help_text="Registered jobs (entry-point group epochal.jobs) of the installed packages."
    )

    class Meta:
        model = ApplicationVersion
        fields = ["application", "number", "job", "code_version", "config", "reason"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [
            (e.name, f"{e.name} — {e.value} ({e.distribution} {e.version})")
            for e in entry_points.registered(entry_points.JOBS)
        ]
        current = self.initial.get("job")
        if current and current not in {name for name, _ in choices}:
            choices.append((current, f"{current} (not installed)"))
        self.fields["job"].choices = choices  # type: ignore[attr-defined]

    def clean_job(self) -> str:
        name = self.cleaned_data["job"]
        error = entry_points.lookup_error(entry_points.JOBS, name)
        if error:
            raise forms.ValidationError(error)
        return str(name)

    def clean_config(self) -> Any:
        config = self.cleaned_data["config"]
        errors = version_config_errors(config or {})
        if errors:
            raise forms.ValidationError("; ".join(m for ms in errors.values() for m in ms))
        return config


@admin.register(ApplicationVersion)
class ApplicationVersionAdmin(admin.ModelAdmin):
    form = VersionForm
    list_display = ["application", "number", "job", "code_version", "created_at"]
    list_filter = ["application"]
    readonly_fields = ["source_snapshot_id", "parent", "created_by", "created_at"]
