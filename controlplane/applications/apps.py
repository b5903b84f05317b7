from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


def _forget(sender: Any, instance: Any, **kwargs: Any) -> None:
    from controlplane.applications.selectors import application_forget

    application_forget(instance.name)


class ApplicationsConfig(AppConfig):
    name = "controlplane.applications"
    label = "applications"
    verbose_name = "Applications"

    def ready(self) -> None:
        post_save.connect(_forget, sender="applications.Application", dispatch_uid="app-ids")
        post_delete.connect(_forget, sender="applications.Application", dispatch_uid="app-ids-d")
