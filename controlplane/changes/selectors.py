"""Revisions: the newest change id of a key (0 when nothing was recorded since the install)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import BigIntegerField, Subquery, Value
from django.db.models.functions import Coalesce

from controlplane.changes.models import Change

_CHANGE = Change._meta.db_table


def revision(key: str) -> int:
    """The revision of `key`: one index probe (a plain statement: no ORM compilation)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT MAX(id) FROM {_CHANGE} WHERE key = %s", [key])
        row = cursor.fetchone()
    return int(row[0] or 0)


def named_revision(*, table: str, name: str, prefix: str) -> tuple[int, int] | None:
    """(id, revision) of the row of `table` called `name` whose changes are recorded under
    ``<prefix>:<id>``, in one statement; None when there is no such row."""
    sql = (
        f"SELECT t.id, (SELECT MAX(c.id) FROM {_CHANGE} c WHERE c.key = %s || t.id) "
        f"FROM {table} t WHERE t.name = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [f"{prefix}:", name])
        row = cursor.fetchone()
    return None if row is None else (int(row[0]), int(row[1] or 0))


def revision_subquery(key: Any) -> Any:
    """An SQL expression for the revision of `key` (a string or an expression), to annotate
    a query with so the revision comes with the rows it describes — in the same statement."""
    newest = Change.objects.filter(key=key).order_by("-id").values("id")[:1]
    return Coalesce(Subquery(newest), Value(0), output_field=BigIntegerField())
