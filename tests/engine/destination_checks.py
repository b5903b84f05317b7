"""What the destination tests compare: a Delta table's or a PostgreSQL table's rows against the
output of a branch's first-parent chain in the store (the failure-free truth)."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pandas as pd
import pyarrow as pa

from runners.engine.output import EPOCH, read_output
from snapshots_store import Repository


def database_url() -> str:
    """The test database (DATABASE_URL) as a psycopg URL."""
    url = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/postgres")
    return "postgresql://" + url.partition("://")[2]


def unique_table(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def frame(table: pa.Table | pd.DataFrame, columns: list[str] | None = None) -> pd.DataFrame:
    """Rows sorted by epoch, then by every other column (a job's key need not be named
    ``key``), in a fixed column order, as plain Python values."""
    df = table if isinstance(table, pd.DataFrame) else table.to_pandas()
    columns = columns or sorted(df.columns)
    order = [c for c in (EPOCH, "key") if c in columns]
    df = df[columns].sort_values([*order, *(c for c in columns if c not in order)], kind="stable")
    return df.reset_index(drop=True).astype(object)


def chain_output(repo: Repository, branch: str = "main") -> pd.DataFrame:
    return frame(read_output(repo, branch))


def latest_per_key(df: pd.DataFrame) -> pd.DataFrame:
    out = df.sort_values([EPOCH, "key"]).groupby("key", as_index=False).last()
    return frame(out, sorted(df.columns))


def delta_rows(path: str) -> pd.DataFrame:
    from deltalake import DeltaTable

    return frame(DeltaTable(path).to_pyarrow_table())


def postgres_rows(table: str) -> pd.DataFrame:
    import psycopg

    with psycopg.connect(database_url()) as conn:
        cur = conn.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description or ()]
        rows: list[Any] = cur.fetchall()
    return frame(pd.DataFrame(rows, columns=names))


def drop_table(table: str) -> None:
    import psycopg

    from runners.engine.destinations.postgres import MARKS

    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"DELETE FROM {MARKS} WHERE destination = %s", (table,))
