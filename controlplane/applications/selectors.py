"""Reads for applications."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.applications.errors import UnknownApplicationError, UnknownVersionError
from controlplane.applications.models import Application, ApplicationVersion


def application_get(*, name: str) -> Application:
    """The application called `name`; UnknownApplicationError otherwise."""
    try:
        return Application.objects.get(name=name)
    except Application.DoesNotExist:
        raise UnknownApplicationError(name) from None


_IDS: dict[str, int] = {}  # name -> id: applications are never renamed
_MAX_IDS = 10_000


def application_ref(*, name: str) -> Application:
    """Application `name` carrying only its id and name — for reads of the lineage index,
    which need nothing else. Ids are remembered per process (no query after the first);
    `application_forget` drops one (saves and deletes do, and a read that found nothing)."""
    pk = _IDS.get(name)
    if pk is None:
        pk = Application.objects.filter(name=name).values_list("pk", flat=True).first()
        if pk is None:
            raise UnknownApplicationError(name)
        if len(_IDS) < _MAX_IDS:
            _IDS[name] = pk
    return Application(pk=pk, name=name)


def application_forget(name: str) -> None:
    _IDS.pop(name, None)


def application_list() -> list[Application]:
    return list(Application.objects.order_by("name"))


def application_names() -> list[str]:
    """Every application's name, in order."""
    return list(Application.objects.order_by("name").values_list("name", flat=True))


# -- versions (added for the REST API) -------------------------------------------------------


def version_list(*, application: Application) -> QuerySet[ApplicationVersion]:
    """The application's versions, oldest first."""
    return ApplicationVersion.objects.filter(application=application).select_related(
        "application", "parent", "created_by"
    )


def version_children(version: ApplicationVersion) -> list[ApplicationVersion]:
    """The versions grown from `version`, oldest first."""
    return list(version.children.order_by("number"))


def version_get(*, application: Application, number: int) -> ApplicationVersion:
    """Version `number` of `application`; UnknownVersionError otherwise."""
    version = version_list(application=application).filter(number=number).first()
    if version is None:
        raise UnknownVersionError(application.name, number)
    return version


def version_latest(*, application: Application) -> ApplicationVersion | None:
    return version_list(application=application).order_by("-number").first()


def application_queryset() -> QuerySet[Application]:
    """Every application by name, as a queryset (for keyset pagination)."""
    return Application.objects.order_by("name")
