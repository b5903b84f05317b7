"""Example job: a rolling fraud / velocity check on card transactions (Parquet input).

For every card, the transactions of the last 10 minutes are kept in a list state (TTL one
hour); a transaction that makes the card exceed 5 transactions or 2,000.00 in 10 minutes raises
an alert row.

    python -m runners.jobs.fraud --data var/demo/transactions --store file://var/store
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from runners.engine import EpochContext, Job, KeyedState, sources
from runners.engine.sources import write_parquet_file

WINDOW_MS = 10 * 60 * 1000
MAX_COUNT = 5
MAX_AMOUNT_CENTS = 200_000


def generate(
    directory: str, *, files: int = 5, transactions: int = 5000, cards: int = 500, seed: int = 2
) -> None:
    """Deterministic transaction files (5 minutes each); a few cards burst."""
    rng = np.random.default_rng(seed)
    for f in range(files):
        card = rng.integers(0, cards, transactions)
        burst = rng.random(transactions) < 0.05
        card = np.where(burst, rng.integers(0, 5, transactions), card)
        ts = np.sort(f * 300_000 + rng.integers(0, 300_000, transactions))
        table = pa.table(
            {
                "card": pa.array([f"card-{c:05d}" for c in card]),
                "amount_cents": pa.array(rng.integers(100, 60_000, transactions)),
                "merchant": pa.array([f"m-{m}" for m in rng.integers(0, 50, transactions)]),
                "ts": pa.array(ts),
            }
        )
        write_parquet_file(directory, f"tx-{f:05d}", table)


def velocity(
    card: Any, records: list[dict[str, Any]], state: KeyedState, ctx: EpochContext
) -> Iterable[dict[str, Any]]:
    """Alert when a card's 10-minute count or amount crosses the limits."""
    recent = state.list("recent", ttl_ms=3_600_000)
    window = recent.get()
    for tx in sorted(records, key=lambda r: r["ts"]):
        window = [w for w in window if tx["ts"] - w[0] < WINDOW_MS]
        window.append((tx["ts"], tx["amount_cents"]))
        count, amount = len(window), sum(a for _, a in window)
        if count > MAX_COUNT or amount > MAX_AMOUNT_CENTS:
            yield {
                "card": card,
                "ts": tx["ts"],
                "merchant": tx["merchant"],
                "count_10m": count,
                "amount_10m_cents": amount,
                "reason": "count" if count > MAX_COUNT else "amount",
            }
    recent.set(window)


def job(directory: str) -> Job:
    source = sources.ParquetDirectory(directory, max_files_per_epoch=1)
    return Job(name="fraud-velocity", source=source, key="card", process=velocity,
               time_mode="logical")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    from runners.jobs.run import run_example

    parser = argparse.ArgumentParser(prog="python -m runners.jobs.fraud")
    run_example(parser, argv, generate=generate, make_job=job, namespace="fraud")


if __name__ == "__main__":
    main()
