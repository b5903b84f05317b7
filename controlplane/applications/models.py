"""Applications and their versions.

One streaming application = one store namespace = one snapshot lineage. An application
version is the code and configuration a job runs (`job`: the name of an entry point of group
``epochal.jobs`` an installed package registers; `code_version`, `config`);
forks create new versions, recording which snapshot they grew from and why.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.patterns import WholeRegexValidator
from runners import entry_points
from runners.job_spec import ENV_NAME_PATTERN, SECRET_NAME_PATTERN

MAX_PARALLELISM_LIMIT = 32768
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
JOB_NAME_PATTERN = entry_points.NAME_PATTERN


CREDENTIALS_IN_URL = (
    "credentials do not go in a URL (it is shown to every viewer and written to logs): "
    "register the store with credentials_env (the prefix of environment variables "
    "<PREFIX>_AWS_ACCESS_KEY_ID and <PREFIX>_AWS_SECRET_ACCESS_KEY) or credentials_secret "
    "(a Kubernetes Secret mounted into the job's pods) instead"
)


def _has_userinfo(url: str) -> bool:
    netloc = urlsplit(url).netloc
    return "@" in netloc


def url_credential_errors(url: str) -> list[str]:
    """[CREDENTIALS_IN_URL] when `url`, or an endpoint_url inside it, carries userinfo
    (``s3://KEY:SECRET@bucket``, ``?endpoint_url=http://user:pw@host``); else []."""
    endpoints = parse_qs(urlsplit(url).query).get("endpoint_url", [])
    if _has_userinfo(url) or any(_has_userinfo(e) for e in endpoints):
        return [CREDENTIALS_IN_URL]
    return []


def shown_url(url: str) -> str:
    """`url` as it may be shown (API answers, the admin, logs): any userinfo — of a row
    registered before the rule — replaced by ``***``."""
    parts = urlsplit(url)

    def hide(netloc: str) -> str:
        return f"***@{netloc.rpartition('@')[2]}" if "@" in netloc else netloc

    query = parts.query
    if "@" in query:
        options = parse_qs(query, keep_blank_values=True)
        options = {
            k: [urlsplit(v)._replace(netloc=hide(urlsplit(v).netloc)).geturl() for v in vs]
            for k, vs in options.items()
        }
        query = urlencode(options, doseq=True, safe=":/*@")
    return parts._replace(netloc=hide(parts.netloc), query=query).geturl()


def store_url_errors(url: str, roots: Sequence[Path]) -> list[str]:
    """What is wrong with `url` as a registered store ([] when nothing): no credentials in it;
    file:// stores live under one of `roots` (symlinks resolved); s3:// stores name a bucket
    and known options."""
    credentials = url_credential_errors(url)
    if credentials:
        return credentials
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.query or parts.fragment:
            return ["a file:// store URL takes no query or fragment"]
        raw = unquote(parts.netloc + parts.path)
        if not raw.startswith("/"):
            return ["a file:// store URL names an absolute directory: file:///path"]
        path = Path(os.path.realpath(raw))
        if not any(path == root or path.is_relative_to(root) for root in roots):
            allowed = ", ".join(str(r) for r in roots) or "none"
            return [
                f"{path} is outside the store roots ({allowed}); an admin adds a root "
                "with EPOCHAL_STORE_ROOTS"
            ]
        return []
    if parts.scheme == "s3":
        if not parts.netloc:
            return ["an s3:// store URL names a bucket: s3://bucket/prefix"]
        options = parse_qs(parts.query)
        unknown = sorted(set(options) - {"endpoint_url", "region"})
        if unknown:
            return [f"unknown option {unknown[0]!r} (known: endpoint_url, region)"]
        endpoint = options.get("endpoint_url", [""])[-1]
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            return ["endpoint_url must be an http:// or https:// URL"]
        return []
    return [f"unsupported scheme {parts.scheme!r}: use file:// or s3://"]


class Store(models.Model):
    """A snapshot store an admin registered: the only places an operation may name.

    `url` is ``file:///path`` (under EPOCHAL_STORE_ROOTS) or ``s3://bucket/prefix[?endpoint_url=
    …&region=…]``. Credentials are never kept here, only where they come from: the name of an
    environment variable prefix (`credentials_env`) or of a Kubernetes secret
    (`credentials_secret`, mounted into the job's driver and executors).
    """

    name = models.CharField(
        max_length=100, unique=True, validators=[WholeRegexValidator(NAME_PATTERN)]
    )
    url = models.CharField(max_length=1000, unique=True)
    credentials_env = models.CharField(
        max_length=100,
        blank=True,
        default="",
        validators=[WholeRegexValidator(ENV_NAME_PATTERN, "an environment variable name")],
        help_text="Environment variable prefix the store's credentials come from "
        "(<PREFIX>_AWS_ACCESS_KEY_ID, <PREFIX>_AWS_SECRET_ACCESS_KEY); never the secret.",
    )
    credentials_secret = models.CharField(
        max_length=253,
        blank=True,
        default="",
        validators=[WholeRegexValidator(SECRET_NAME_PATTERN, "a Kubernetes secret name")],
        help_text="Kubernetes secret holding the store's credentials, mounted into job pods.",
    )
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def shown_url(self) -> str:
        return shown_url(self.url)

    def clean(self) -> None:
        errors = store_url_errors(self.url, settings.EPOCHAL_STORE_ROOTS)
        if errors:
            raise ValidationError({"url": errors})


class Application(models.Model):
    """A streaming application whose snapshots live in `store_namespace` of the store.

    `max_parallelism` (M) is fixed for the lineage at creation; changing it is an explicit
    rehash migration that creates a new commit. `store` (a registered `Store`) empty means
    the deployment's `STORE_URL`.
    """

    name = models.CharField(
        max_length=100, unique=True, validators=[WholeRegexValidator(NAME_PATTERN)]
    )
    store_namespace = models.CharField(
        max_length=100, unique=True, validators=[WholeRegexValidator(NAME_PATTERN)]
    )
    max_parallelism = models.PositiveIntegerField(
        default=128, validators=[MinValueValidator(1), MaxValueValidator(MAX_PARALLELISM_LIMIT)]
    )
    store = models.ForeignKey(
        Store, null=True, blank=True, on_delete=models.PROTECT, related_name="applications"
    )
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_parallelism__gte=1)
                & models.Q(max_parallelism__lte=MAX_PARALLELISM_LIMIT),
                name="application_max_parallelism_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def effective_store_url(self) -> str:
        return self.store.url if self.store is not None else settings.EPOCHAL_STORE_URL


class ApplicationVersion(models.Model):
    """The code and configuration of an application at one point of its life.

    `config` holds launcher settings (resources, image, node selector, tolerations, spark
    conf, restart policy); see docs/control-plane.md. A version made by a fork records the
    snapshot it grew from (`source_snapshot_id`), who asked (`created_by`) and why (`reason`).
    """

    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    job = models.CharField(
        max_length=255,
        validators=[
            WholeRegexValidator(
                JOB_NAME_PATTERN, "a job is named by its entry-point name (epochal.jobs)"
            )
        ],
    )
    code_version = models.CharField(max_length=255, blank=True, default="")
    config = models.JSONField(default=dict, blank=True)
    source_snapshot_id = models.CharField(max_length=64, blank=True, default="")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    reason = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["application", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["application", "number"], name="application_version_number_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.application.name} v{self.number}"


class Sink(models.Model):
    """A destination an admin registered: the only places a version may send its output.

    `kind` is one of the engine's destinations (runners/engine/destinations: delta, postgres,
    kafka, …); `config` its settings (a Delta table's ``path`` under EPOCHAL_SINK_ROOTS, a
    PostgreSQL ``url`` and ``table``, …), checked by the destination itself and against the
    allowed roots and hosts (`controlplane.applications.sinks`). Credentials are never kept
    here, only the environment variable they come from (`credentials_env`) and, for
    Kubernetes launches, the Secret holding that variable (`credentials_secret`).
    """

    name = models.CharField(
        max_length=100, unique=True, validators=[WholeRegexValidator(NAME_PATTERN)]
    )
    kind = models.CharField(max_length=50)
    config = models.JSONField(default=dict, blank=True)
    credentials_env = models.CharField(
        max_length=100,
        blank=True,
        default="",
        validators=[WholeRegexValidator(ENV_NAME_PATTERN, "an environment variable name")],
        help_text="Environment variable the sink's credentials come from (PostgreSQL: the "
        "password; Delta on S3: the prefix of <PREFIX>_AWS_ACCESS_KEY_ID and "
        "<PREFIX>_AWS_SECRET_ACCESS_KEY); never the secret.",
    )
    credentials_secret = models.CharField(
        max_length=253,
        blank=True,
        default="",
        validators=[WholeRegexValidator(SECRET_NAME_PATTERN, "a Kubernetes secret name")],
        help_text="Kubernetes secret holding the variable credentials_env names, mounted into "
        "the pods of jobs writing to the sink (Kubernetes launches need it).",
    )
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from controlplane.applications.sink_config import sink_config_errors

        errors = sink_config_errors(self.name, self.kind, self.config, self.credentials_env)
        if self.credentials_secret and not self.credentials_env:
            errors["credentials_secret"] = [
                "the secret holds the variable credentials_env names: set credentials_env too"
            ]
        if errors:
            raise ValidationError(errors)
