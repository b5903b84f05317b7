"""The store registry: the places an operation may name, registered by admins.

An operator never gives a URL: migrate names a registered store. A `file://` store must live
under `EPOCHAL_STORE_ROOTS`; credentials are named (environment variable prefix, Kubernetes
secret), never stored: `store_repository` reads the variables when the store is used.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from controlplane.applications.models import Store
from controlplane.config import secret_from_environment
from controlplane.errors import Conflict, InvalidRequest, OperationFailed
from runners.local import CREDENTIAL_NAMES
from snapshots_store import Repository
from snapshots_store.backends import local_store_url
from snapshots_store.backends.s3 import S3Credentials


class UnknownStoreError(LookupError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no store named {name!r} is registered; an admin registers one "
            "(admin site, or `epochal register-store NAME URL`); GET /api/stores/ lists them"
        )


class StoreCredentialsMissing(OperationFailed):
    """A store names environment variables for its credentials that this process lacks."""

    code = "store_credentials_missing"


def credential_variables(store: Store) -> tuple[str, str, str]:
    """The environment variables `store`'s credentials come from: access key id, secret
    access key, session token (optional)."""
    key_id, secret, token = (f"{store.credentials_env}_{name}" for name in CREDENTIAL_NAMES)
    return key_id, secret, token


def store_credentials(store: Store) -> S3Credentials | None:
    """`store`'s credentials, read now from the environment variables it names (never from
    the database); None when it names none (boto3's own search, or a mounted secret).
    StoreCredentialsMissing, naming the store and the variables, when one is not set."""
    if not store.credentials_env:
        return None
    key_id, secret, token = credential_variables(store)
    missing = [name for name in (key_id, secret) if not secret_from_environment(name)]
    if missing:
        raise StoreCredentialsMissing(
            f"store {store.name!r} takes its credentials from the environment variables "
            f"{key_id} and {secret}, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set in this process: set "
            f"{'it' if len(missing) == 1 else 'them'} in the environment of the control "
            "plane's web and worker processes (e.g. from a Secret in the Helm values), then "
            "retry; nothing was written",
            detail={"store": store.name, "missing": missing},
        )
    return S3Credentials(
        secret_from_environment(key_id),
        secret_from_environment(secret),
        secret_from_environment(token) or None,
    )


def store_repository(store: Store, namespace: str) -> Repository:
    """The repository of `namespace` in `store`, with the store's credentials."""
    return Repository.open(store.url, namespace, credentials=store_credentials(store))


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
