"""Domain errors about applications."""

from __future__ import annotations


class UnknownApplicationError(LookupError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no application named {name!r}; create it first "
            "(or run `manage.py reindex --application NAME --create`)"
        )
