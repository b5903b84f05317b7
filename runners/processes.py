"""Local process and run-directory helpers shared by the local launcher and its standbys."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def process_start_time(pid: int) -> str | None:
    """Start time of `pid` in clock ticks since boot (None when gone or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in {"Z", "X"}:
        return None
    return fields[19]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid` (Linux /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in {"Z", "X"} and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def write_json(path: Path, data: Mapping[str, Any], *, dir_fd: int | None = None) -> None:
    """Write `data` to `path` atomically (a temporary file, then a rename). With `dir_fd`,
    `path` is a name inside that open directory, which may have been renamed meanwhile."""
    tmp = path.with_name(f".{path.name}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(data))
    os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def read_json(path: Path, *, dir_fd: int | None = None) -> dict[str, Any] | None:
    """The JSON object in `path` (None when missing, unreadable or not an object)."""
    try:
        fd = os.open(path, os.O_RDONLY, dir_fd=dir_fd)
        with os.fdopen(fd) as source:
            data = json.loads(source.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def process_alive(pid: int, start_time: str | None) -> bool:
    """`pid` is running and (when `start_time` is known) is the process that was started."""
    started = process_start_time(pid)
    return started is not None and (start_time is None or started == start_time)
