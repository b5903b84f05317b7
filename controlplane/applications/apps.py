from django.apps import AppConfig


class ApplicationsConfig(AppConfig):
    name = "controlplane.applications"
    label = "applications"
    verbose_name = "Applications"
