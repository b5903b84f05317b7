"""The store registry: the places an operation may name, registered by admins.

An operator never gives a URL: migrate names a registered store. A `file://` store must live
under `EPOCHAL_STORE_ROOTS`; credentials are named (environment variable prefix, Kubernetes
secret), never stored.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from controlplane.applications.models import Store
from controlplane.errors import Conflict, InvalidRequest
from snapshots_store.backends import local_store_url


class UnknownStoreError(LookupError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no store named {name!r} is registered; an admin registers one "
            "(admin site, or `manage.py register_store NAME URL`); GET /api/stores/ lists them"
        )


def store_get(*, name: str) -> Store:
    store = Store.objects.filter(name=name).first()
    if store is None:
        raise UnknownStoreError(name)
    return store


def store_list() -> list[Store]:
    return list(Store.objects.order_by("name"))


def store_register(
    *,
    name: str,
    url: str,
    credentials_env: str = "",
    credentials_secret: str = "",
    description: str = "",
) -> Store:
    """Register a store (admins only); InvalidRequest names the bad field, Conflict a taken
    name or URL."""
    from django.conf import settings

    store = Store(
        name=name,
        url=local_store_url(url, root=settings.BASE_DIR, default=settings.BASE_DIR) if url else "",
        credentials_env=credentials_env,
        credentials_secret=credentials_secret,
        description=description,
    )
    try:
        store.full_clean(validate_unique=False)
    except ValidationError as exc:
        raise InvalidRequest(
            "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()),
            fields=exc.message_dict,
        ) from None
    try:
        with transaction.atomic():
            store.save()
    except IntegrityError:
        taken = "name" if Store.objects.filter(name=name).exists() else "url"
        raise Conflict(
            f"a store with this {taken} is registered already",
            code="store_exists",
            fields={taken: ["taken"]},
        ) from None
    return store
