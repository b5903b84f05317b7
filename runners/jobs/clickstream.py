"""Example job: per-user session statistics on a clickstream (JSON-lines input).

A session ends after 30 minutes without a click. Each closed session is emitted once with its
start, end, clicks and distinct pages; the open session lives in keyed state.

    python -m runners.jobs.clickstream --data var/demo/clicks --store file://var/store
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterable
from typing import Any

from runners.engine import EpochContext, Job, KeyedState, sources
from runners.engine.sources import write_jsonl_file

SESSION_GAP_MS = 30 * 60 * 1000
PAGES = ["/", "/search", "/product", "/cart", "/checkout", "/help", "/account"]


def generate(
    directory: str, *, files: int = 5, clicks: int = 2000, users: int = 200, seed: int = 1
) -> None:
    """Deterministic click files of 20 minutes each; in each file a third of the users is
    active, so sessions end when a user stays away for more than one file."""
    rng = random.Random(seed)
    for f in range(files):
        start = f * 20 * 60 * 1000
        active = rng.sample(range(users), max(1, users // 3))
        rows = []
        for _ in range(clicks):
            rows.append(
                {
                    "user": f"user-{rng.choice(active)}",
                    "page": rng.choice(PAGES),
                    "ts": start + rng.randrange(20 * 60 * 1000),
                }
            )
        rows.sort(key=lambda r: r["ts"])
        write_jsonl_file(directory, f"clicks-{f:05d}", rows)


def sessions(
    user: Any, records: list[dict[str, Any]], state: KeyedState, ctx: EpochContext
) -> Iterable[dict[str, Any]]:
    """Extend or close the user's open session with this epoch's clicks."""
    current = state.value("session")
    session = current.get()
    for click in sorted(records, key=lambda r: r["ts"]):
        if session is not None and click["ts"] - session["end"] > SESSION_GAP_MS:
            yield _closed(user, session)
            session = None
        if session is None:
            session = {"start": click["ts"], "end": click["ts"], "clicks": 0, "pages": []}
        session["end"] = max(session["end"], click["ts"])
        session["clicks"] += 1
        if click["page"] not in session["pages"]:
            session["pages"].append(click["page"])
    current.set(session)


def _closed(user: Any, session: dict[str, Any]) -> dict[str, Any]:
    return {
        "user": user,
        "session_start": session["start"],
        "session_end": session["end"],
        "clicks": session["clicks"],
        "distinct_pages": len(session["pages"]),
    }


def job(directory: str) -> Job:
    source = sources.JsonLinesDirectory(
        directory, schema={"user": "string", "page": "string", "ts": "int64"}
    )
    return Job(name="clickstream-sessions", source=source, key="user", process=sessions,
               time_mode="logical")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    from runners.jobs.run import run_example

    parser = argparse.ArgumentParser(prog="python -m runners.jobs.clickstream")
    run_example(parser, argv, generate=generate, make_job=job, namespace="clickstream")


if __name__ == "__main__":
    main()
