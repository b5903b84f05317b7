"""WSGI entry point (`granian --interface=wsgi controlplane.wsgi:application`, in each worker
process): refuses to load on unsafe settings."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = get_wsgi_application()

from controlplane.deployment import refuse_unsafe_start  # noqa: E402  (needs Django set up)

refuse_unsafe_start()
