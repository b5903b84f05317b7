"""Model instances from a hand-written statement, without the ORM's per-query compilation.

For the hottest reads a queryset's compilation (select list, joins, ordering: several ms of
Python per statement) costs more than the database's answer. `Columns(Model, "alias")`
gives the select list of one model's concrete columns under a table alias, and turns its
slice of a result row into an instance (`Model.from_db`) with the same value conversions
the ORM applies (JSON, vendor types). The statement itself is written once, by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, models


class Columns:
    def __init__(self, model: type[models.Model], alias: str) -> None:
        self.model = model
        self.alias = alias
        self.fields = list(model._meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        self._converters: list[tuple[Any, list[Callable[..., Any]]]] | None = None

    @property
    def width(self) -> int:
        return len(self.fields)

    def select(self) -> str:
        qn = connection.ops.quote_name
        return ", ".join(f"{self.alias}.{qn(f.column)}" for f in self.fields)

    def _converters_of(self) -> list[tuple[Any, list[Callable[..., Any]]]]:
        if self._converters is None:
            table = self.model._meta.db_table
            converters = []
            for field in self.fields:
                column = field.get_col(table)
                found = [
                    *connection.ops.get_db_converters(column),
                    *column.get_db_converters(connection),
                ]
                converters.append((column, found))
            self._converters = converters
        return self._converters

    def instance(self, values: Sequence[Any]) -> Any:
        """The instance of this slice of a row; None when its primary key is NULL (an outer
        join that matched nothing)."""
        pk_index = self.attnames.index(self.model._meta.pk.attname)
        if values[pk_index] is None:
            return None
        converted = []
        for value, (column, converters) in zip(values, self._converters_of(), strict=True):
            for convert in converters:
                value = convert(value, column, connection)
            converted.append(value)
        return self.model.from_db(connection.alias, self.attnames, converted)


def split(row: Sequence[Any], parts: Sequence[Columns]) -> list[Any]:
    """`row` (the parts' columns in order) as one instance (or None) per part."""
    found, start = [], 0
    for part in parts:
        found.append(part.instance(row[start : start + part.width]))
        start += part.width
    return found
