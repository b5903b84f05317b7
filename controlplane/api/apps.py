from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "controlplane.api"
    label = "api"
    verbose_name = "REST API"

    def ready(self) -> None:
        from controlplane import deployment  # noqa: F401  (registers the deployment checks)
