"""The engine's events in a run's log: one JSON object per line (runners/engine/main.py)."""

from __future__ import annotations

import json
from typing import Any


def engine_event(line: str) -> dict[str, Any] | None:
    """The engine's JSON event on a whole log line (`{"event": …}`), None for other lines."""
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None
