"""Static files that ship inside Python packages rather than in our repository.

`plotly.min.js` comes with the pinned `plotly` package (``plotly/package_data``); this finder
serves it as ``web/vendor/plotly.min.js`` so no page ever asks a CDN, and collectstatic copies
it like any other static file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from django.contrib.staticfiles.finders import BaseFinder
from django.core.checks import CheckMessage, Error
from django.core.files.storage import FileSystemStorage

PREFIX = "web/vendor"
FILES = {"plotly.min.js": ("plotly", "package_data")}


def _directory(package: str, folder: str) -> str:
    module = __import__(package)
    return os.path.join(os.path.dirname(module.__file__ or ""), folder)


class PackageDataFinder(BaseFinder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.storages = {
            name: FileSystemStorage(location=_directory(*where)) for name, where in FILES.items()
        }
        for storage in self.storages.values():
            storage.prefix = PREFIX  # type: ignore[attr-defined]

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        return [
            Error(f"{name} is missing from {storage.location}: reinstall the pinned packages")
            for name, storage in self.storages.items()
            if not storage.exists(name)
        ]

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> str | list[str]:
        find_all = find_all or bool(kwargs.get("all"))
        directory, _, name = path.rpartition("/")
        storage = self.storages.get(name) if directory == PREFIX else None
        if storage is None or not storage.exists(name):
            return [] if find_all else ""
        found = storage.path(name)
        return [found] if find_all else found

    def list(self, ignore_patterns: Any) -> Iterator[tuple[str, FileSystemStorage]]:
        for name, storage in self.storages.items():
            if storage.exists(name):
                yield name, storage
