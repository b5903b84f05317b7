"""Fast row writes for the index: reserved primary keys and bulk inserts.

Indexing writes thousands of rows that reference each other (a snapshot names its chain and
its first parent), so keys are reserved first and rows inserted with them, without ORM
objects: COPY on PostgreSQL, `executemany` elsewhere. Used by the services and by the
benchmark's bulk loader. Callers hold the application lock (see services.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import connection, models


def reserve_ids(model: type[models.Model], n: int) -> list[int]:
    """`n` fresh primary keys for `model`.

    PostgreSQL draws them from the column's sequence (safe against concurrent writers);
    elsewhere (SQLite: one writer at a time) they continue after the largest id.
    """
    if n <= 0:
        return []
    table = model._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
                [table, n],
            )
            return [row[0] for row in cursor.fetchall()]
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {connection.ops.quote_name(table)}")
        first = int(cursor.fetchone()[0]) + 1
        return list(range(first, first + n))


def insert_rows(
    model: type[models.Model], columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> int:
    """Insert plain rows (JSON columns given as JSON text); returns how many."""
    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(connection.ops.quote_name(c) for c in columns)
    count = 0
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            raw = cursor.cursor  # psycopg's cursor under Django's wrapper
            with raw.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
                    count += 1
            return count
        sql = f"INSERT INTO {table} ({names}) VALUES ({', '.join(['%s'] * len(columns))})"
        adapt = connection.ops.adapt_datetimefield_value
        batch: list[list[Any]] = []
        for row in rows:
            batch.append([adapt(v) if isinstance(v, datetime) else v for v in row])
            if len(batch) == 5000:
                cursor.executemany(sql, batch)
                count += len(batch)
                batch = []
        if batch:
            cursor.executemany(sql, batch)
            count += len(batch)
    return count
