"""The settings of a test run: the project's, with debug asked for explicitly (production
defaults have it off). Subprocesses the tests start (servers, workers, `manage.py`) inherit it
through the environment. tests/security/test_defaults.py checks the production defaults."""

import os

os.environ.setdefault("DJANGO_DEBUG", "true")

from controlplane.settings import *  # noqa: F403
