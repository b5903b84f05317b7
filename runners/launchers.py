"""Pick a launcher by name, at the edge: the one module that knows every implementation.

`runners.launcher` defines the protocol and what both implementations share; it never imports
them, so the arrows run `launchers -> local | kubernetes -> launcher`.
"""

from __future__ import annotations

import os

from runners.launcher import Launcher, LauncherError


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
    raise LauncherError(f"RUNNER={chosen!r} is not supported: use local or kubernetes")
