"""A control-plane replica for the leadership test: its own "beat" ticks every `interval`
seconds and calls `leadership.lead`, whose act appends ``<pid> <time>`` to a shared file.

    python -m tests.faults.replica ROLE INTERVAL_S SECONDS OUT_FILE
"""

from __future__ import annotations

import os
import sys
import time

import django


def main() -> None:
    role, interval, seconds, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from controlplane import leadership

    def act() -> None:
        with open(out, "a") as log:
            log.write(f"{os.getpid()} {time.time():.4f}\n")

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        leadership.lead(role, interval, act)
        time.sleep(interval / 4)  # two beats a replica: ticks more often than the interval


if __name__ == "__main__":
    main()
