"""Writes for applications."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.errors import Conflict, InvalidRequest
from runners import entry_points


def application_create(
    *, name: str, store_namespace: str | None = None, max_parallelism: int = 128
) -> Application:
    """Create an application (its store namespace defaults to its name).

    A taken name or namespace is a `Conflict` (409) whether it was taken long ago or by a
    concurrent request a moment ago: the database's unique constraints decide."""
    application = Application(
        name=name, store_namespace=store_namespace or name, max_parallelism=max_parallelism
    )
    try:
        application.full_clean(validate_unique=False)
    except ValidationError as exc:
        raise InvalidRequest("invalid application", fields=exc.message_dict) from None
    try:
        with transaction.atomic():
            application.save()
    except IntegrityError:
        taken = Application.objects.filter(name=name).exists()
        field = "name" if taken else "store_namespace"
        value = name if taken else application.store_namespace
        raise Conflict(
            f"an application with {field} {value!r} exists already",
            code="application_exists",
            fields={field: ["taken"]},
        ) from None
    return application


def version_create(
    *,
    application: Application,
    job: str,
    code_version: str = "",
    config: Mapping[str, Any] | None = None,
    reason: str = "",
    created_by: AbstractBaseUser | None = None,
) -> ApplicationVersion:
    """Add the next version of `application` (InvalidRequest when its job is not a registered
    entry point or its config cannot launch). Only admins reach this: a version is code."""
    from controlplane.jobs.services import version_config_errors

    config = dict(config or {}) if isinstance(config or {}, Mapping) else config
    errors = version_config_errors(config)  # type: ignore[arg-type]
    job_error = entry_points.lookup_error(entry_points.JOBS, job)
    if job_error:
        errors = {"job": [job_error], **errors}
    if errors:
        raise InvalidRequest(
            "; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()), fields=errors
        )
    for _ in range(5):
        number = (
            ApplicationVersion.objects.filter(application=application)
            .order_by("-number")
            .values_list("number", flat=True)
            .first()
            or 0
        ) + 1
        version = ApplicationVersion(
            application=application,
            number=number,
            job=job,
            code_version=code_version,
            config=config,
            reason=reason,
            created_by=created_by,
        )
        try:
            version.full_clean(validate_constraints=False)
        except ValidationError as exc:
            raise InvalidRequest("invalid version", fields=exc.message_dict) from None
        try:
            with transaction.atomic():
                version.save()
            return version
        except IntegrityError:
            continue  # another writer took this number
    raise Conflict(f"could not number a new version of {application.name}; retry")
