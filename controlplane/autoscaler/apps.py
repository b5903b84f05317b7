from django.apps import AppConfig


class AutoscalerConfig(AppConfig):
    name = "controlplane.autoscaler"
    label = "autoscaler"
    verbose_name = "Autoscaler"
