"""Filters the templates share: short ids, sizes, ages."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def short(value: Any, length: int = 12) -> str:
    """The first characters of a snapshot or operation id."""
    return str(value or "")[: int(length)]


@register.filter
def size(value: Any) -> str:
    """Bytes in words: 0 B, 812 B, 14.2 KB, 3.1 MB."""
    if value is None or value == "":
        return "—"
    n = float(value)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def seconds_words(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 1:
        return "now"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} d"


@register.filter
def duration(value: Any) -> str:
    """Seconds in words (None: —)."""
    return "—" if value is None else seconds_words(float(value))


@register.filter
def ago(value: datetime | None) -> str:
    """How long ago a moment was: "12 s ago"."""
    if value is None:
        return "never"
    words = seconds_words((timezone.now() - value).total_seconds())
    return "just now" if words == "now" else f"{words} ago"


@register.filter
def percent(value: Any) -> str:
    return "—" if value is None else f"{float(value) * 100:.0f}%"


@register.filter
def number(value: Any) -> str:
    """Thousands separated."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


@register.filter
def get(mapping: Any, key: Any) -> Any:
    """mapping[key] in a template (None when absent)."""
    try:
        return mapping[key]
    except (KeyError, IndexError, TypeError):
        return None


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON (values JSON does not know are written as text)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@register.filter
def details(value: Any) -> str:
    """An audit entry's detail as words: ``key: value`` pairs joined by `` · `` (nested values
    the same way in braces, lists comma-separated, empty values left out)."""
    if isinstance(value, dict):
        parts = [
            f"{key.replace('_', ' ')}: "
            + (f"{{{details(item)}}}" if isinstance(item, dict) else details(item))
            for key, item in sorted(value.items())
            if item not in (None, "", [], {})
        ]
        return " · ".join(parts)
    if isinstance(value, list | tuple):
        return ", ".join(details(item) for item in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


@register.filter
def phase_seconds(phase: Any) -> float | None:
    """How long an operation's phase took (running: so far; None when it has not started)."""
    from django.utils.dateparse import parse_datetime

    if not isinstance(phase, dict) or not phase.get("started_at"):
        return None
    started = parse_datetime(str(phase["started_at"]))
    ended = parse_datetime(str(phase["finished_at"])) if phase.get("finished_at") else None
    if started is None:
        return None
    return max(0.0, ((ended or timezone.now()) - started).total_seconds())


@register.filter
def seconds(value: Any) -> str:
    """A duration to a tenth of a second, as the CLI prints a phase's: "4.2 s", "2 min 5 s"."""
    if value is None:
        return "—"
    s = float(value)
    if s < 120:
        return f"{s:.1f} s"
    return f"{int(s // 60)} min {int(s % 60)} s"


VIA = {
    "cli": "the command line (epochal)",
    "web": "the dashboard",
    "api": "the REST API",
    "reconciler": "the reconciler",
    "autoscaler": "the autoscaler",
    "schedule": "the job's savepoint schedule",
}


@register.filter
def asked_by(operation: Any) -> str:
    """Who asked for an operation and how, in words."""
    via = VIA.get(operation.requested_via, operation.requested_via)
    user = operation.requested_by
    if user is not None:
        return f"{user.get_username()}, through {via}"
    if operation.requested_via == "cli":
        return f"{via}, with no user named (`--as USER` names one)"
    if operation.requested_via in ("reconciler", "autoscaler", "schedule"):
        return f"{via}, on its own"
    return via


@register.filter
def event_instant(value: Any) -> str:
    """Milliseconds since the Unix epoch (an event time, a watermark) as a UTC date and time
    to the second (None: —)."""
    if value is None:
        return "—"
    moment = datetime.fromtimestamp(int(value) / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")
