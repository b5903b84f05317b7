"""Pick a launcher by name, at the edge: the one module that knows every implementation.

`runners.launcher` defines the protocol and what the implementations share; it never imports
them, so the arrows run `launchers -> local | standalone | kubernetes -> launcher`.
"""

from __future__ import annotations

from runners import config
from runners.config import RunnersConfig
from runners.launcher import Launcher, LauncherError

#: The launchers by name (`RUNNER`, a job's `runner`): the one list every check uses.
RUNNERS = ("local", "kubernetes", "standalone")


def get_launcher(name: str | None = None, configuration: RunnersConfig | None = None) -> Launcher:
    """The launcher for `name`, or for `RUNNER` (default `local`), set up from the runners'
    configuration (default: this process's, runners/config.py)."""
    settings = configuration or config.current()
    chosen = (name or settings.runner).lower()
    if chosen == "local":
        from runners.local import LocalLauncher

        return LocalLauncher.from_config(settings)
    if chosen == "kubernetes":
        # Imported only when chosen: the Kubernetes client is slow to import.
        from runners.kubernetes import KubernetesLauncher

        return KubernetesLauncher.from_config(settings)
    if chosen == "standalone":
        from runners.standalone import StandaloneLauncher

        return StandaloneLauncher.from_config(settings)
    raise LauncherError(f"RUNNER={chosen!r} is not supported: use {', '.join(RUNNERS)}")
