from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "controlplane.operations"
    label = "operations"
    verbose_name = "Operations"
