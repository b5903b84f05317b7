"""Domain errors about applications."""

from __future__ import annotations


class UnknownApplicationError(LookupError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no application named {name!r}; create it first "
            "(or run `manage.py reindex --application NAME --create`)"
        )


class UnknownVersionError(LookupError):
    def __init__(self, application: str, number: int) -> None:
        super().__init__(
            f"application {application!r} has no version {number}; list its versions with "
            f"GET /api/applications/{application}/versions/"
        )
