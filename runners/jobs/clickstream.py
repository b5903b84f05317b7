"""Example job: per-user session statistics on a clickstream (JSON-lines input).

A session ends after 30 minutes without a click. Each closed session is emitted once with its
start, end, clicks and distinct pages; the open session lives in keyed state.

    python -m runners.jobs.clickstream --data var/demo/clicks --store file://var/store

The same job reads a RabbitMQ or Redis stream of the same JSON clicks instead of files with
``job(source="rabbitmq-stream", url="rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F",
streams=["clicks"])`` (or ``source="redis-stream", url="redis://127.0.0.1:6379/0"``); the
source and its place are part of the job arguments of the version, which only admins create.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from runners.engine import EpochContext, Job, KeyedState, sources
from runners.engine.sources import write_jsonl_file

SESSION_GAP_MS = 30 * 60 * 1000
PAGES = ["/", "/search", "/product", "/cart", "/checkout", "/help", "/account"]


SOURCES = ("files", "rabbitmq-stream", "redis-stream", "kafka")
SCHEMA = {"user": "string", "page": "string", "ts": "int64"}


def click_batches(
    files: int, *, clicks: int = 2000, users: int = 200, seed: int = 1
) -> Iterator[list[dict[str, Any]]]:
    """Deterministic batches of clicks of 20 minutes each; in each batch a third of the users
    is active, so sessions end when a user stays away for more than one batch."""
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
        yield rows


def generate(
    directory: str, *, files: int = 5, clicks: int = 2000, users: int = 200, seed: int = 1
) -> None:
    """One JSON-lines file per batch of `click_batches` (existing files are rewritten equal)."""
    for f, rows in enumerate(click_batches(files, clicks=clicks, users=users, seed=seed)):
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


def job(
    directory: str = "",
    *,
    source: str = "files",
    url: str = "",
    streams: Sequence[str] = ("clicks",),
    start: str = "earliest",
) -> Job:
    """The session job over JSON-lines files in `directory` (default) or over the streams
    `streams` at `url` (`source` ``rabbitmq-stream`` or ``redis-stream``; ``kafka``: `url` is
    the bootstrap servers and `streams` the topics; see docs/sources.md)."""
    reader: Any
    if source == "files":
        if not directory:
            raise ValueError("source files needs a directory")
        reader = sources.JsonLinesDirectory(directory, schema=SCHEMA)
    elif source == "rabbitmq-stream":
        from runners.engine.rabbitmq_stream import RabbitMQStreamSource

        reader = RabbitMQStreamSource(url, list(streams), SCHEMA, required=("user",), start=start)
    elif source == "redis-stream":
        from runners.engine.redis_stream import RedisStreamSource

        reader = RedisStreamSource(url, list(streams), SCHEMA, required=("user",), start=start)
    elif source == "kafka":
        from runners.engine.kafka_source import KafkaSource

        reader = KafkaSource(url, list(streams), SCHEMA, required=("user",), start=start)
    else:
        raise ValueError(f"source {source!r}: expected one of {', '.join(SOURCES)}")
    return Job(name="clickstream-sessions", source=reader, key="user", process=sessions,
               time_mode="logical")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    from runners.jobs.run import run_example

    parser = argparse.ArgumentParser(prog="python -m runners.jobs.clickstream")
    run_example(parser, argv, generate=generate, make_job=job, namespace="clickstream")


if __name__ == "__main__":
    main()
