"""The Celery app. Tasks are thin wrappers that call services (see each app's tasks.py)."""

from __future__ import annotations

import os

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

# `filesystem://` (the embedded default broker) with message files written atomically
# (controlplane/broker.py). An alias, not `broker_transport`, which would also force it on a
# connection to another URL (redis://, amqp://).
TRANSPORT_ALIASES["filesystem"] = "controlplane.broker:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("epochal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
