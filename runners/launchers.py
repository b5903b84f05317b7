"""Pick a launcher by name, at the edge: the one module that knows every implementation.

`runners.launcher` defines the protocol and what the implementations share; it never imports
them, so the arrows run `launchers -> local | standalone | kubernetes -> launcher`.
"""

from __future__ import annotations

import os

from runners.launcher import Launcher, LauncherError

#: The launchers by name (`RUNNER`, a job's `runner`): the one list every check uses.
RUNNERS = ("local", "kubernetes", "standalone")


def get_launcher(name: str | None = None) -> Launcher:
    """The launcher for `name`, or for `RUNNER` (default `local`), configured from the env."""
    chosen = (name or os.environ.get("RUNNER", "").strip() or "local").lower()
    if chosen == "local":
        from runners.local import LocalLauncher

        return LocalLauncher.from_env()
    if chosen == "kubernetes":
        # Imported only when chosen: the Kubernetes client is slow to import.
        from runners.kubernetes import KubernetesLauncher

        return KubernetesLauncher.from_env()
    if chosen == "standalone":
        from runners.standalone import StandaloneLauncher

        return StandaloneLauncher.from_env()
    raise LauncherError(f"RUNNER={chosen!r} is not supported: use {', '.join(RUNNERS)}")
