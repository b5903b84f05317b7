from django.apps import AppConfig


class LineageConfig(AppConfig):
    name = "controlplane.lineage"
    label = "lineage"
    verbose_name = "Snapshot lineage"
