"""The Epochal control plane: Django project, Celery app and the domain apps."""

from controlplane.celery import app as celery_app

__all__ = ["celery_app"]
