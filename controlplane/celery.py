"""The Celery app. Tasks are thin wrappers that call services (see each app's tasks.py)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("epochal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
