"""`manage.py reindex [--application NAME] [--store URL] [--create] [--sink-facts]`: bring the
lineage index up to date with the store (idempotent; only new commits and reflog entries are
read; `--sink-facts` also fills the sink facts of snapshots indexed before they were kept)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.applications.errors import UnknownApplicationError
from controlplane.applications.models import Application
from controlplane.applications.selectors import application_get, application_list
from controlplane.applications.services import application_create
from controlplane.lineage.errors import LineageError
from controlplane.lineage.services import (
    ReindexProgress,
    refresh_sink_facts,
    reindex_application,
)
from snapshots_store import Repository, StoreError


class Command(BaseCommand):
    help = "Rebuild or catch up the lineage index from the snapshot store."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--application", help="one application (default: all)")
        parser.add_argument(
            "--store", help="store URL (default: STORE_URL, i.e. settings.EPOCHAL_STORE_URL)"
        )
        parser.add_argument(
            "--create",
            action="store_true",
            help="create the application (namespace = name) when it does not exist",
        )
        parser.add_argument(
            "--sink-facts",
            action="store_true",
            help="also read the manifests of snapshots indexed without sink facts (indexed "
            "before the index kept them) and fill them in",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        url = options["store"] or settings.EPOCHAL_STORE_URL
        applications = self._applications(options["application"], create=options["create"])
        if not applications:
            raise CommandError("no applications to reindex; pass --application NAME --create")
        for application in applications:
            self._reindex(application, url)
            if options["sink_facts"]:
                repo = Repository.open(url, application.store_namespace)
                filled = refresh_sink_facts(application=application, repo=repo)
                self.stdout.write(f"{application.name}: sink facts of {filled} snapshots filled")

    def _applications(self, name: str | None, *, create: bool) -> list[Application]:
        if name is None:
            return application_list()
        try:
            return [application_get(name=name)]
        except UnknownApplicationError as exc:
            if not create:
                raise CommandError(str(exc)) from None
            try:
                return [application_create(name=name)]
            except Exception as err:
                raise CommandError(f"cannot create application {name!r}: {err}") from None

    def _reindex(self, application: Application, url: str) -> None:
        progress = ProgressBar(application.name, sys.stderr)

        try:
            repo = Repository.open(url, application.store_namespace)
            result = reindex_application(application=application, repo=repo, progress=progress)
        except (StoreError, LineageError) as exc:
            raise CommandError(f"reindex of {application.name!r} failed: {exc}") from None
        self.stdout.write(
            f"{result.application}: {result.snapshots_added} new snapshots "
            f"({result.snapshots_total} indexed), {result.reflog_entries_added} new reflog "
            f"entries, {result.refs} refs, {len(result.skipped)} skipped, "
            f"{len(result.missing)} missing from the store, "
            f"{result.seconds:.2f}s ({result.snapshots_per_s:.0f} snapshots/s)"
        )
        for sid in result.skipped[:10]:
            self.stdout.write(f"  skipped {sid}: its history is incomplete in the store")
        for sid in result.missing[:10]:
            self.stdout.write(f"  missing {sid}: named in history but not in the store (gc?)")


class ProgressBar:
    """Reindex progress on `out`: on a terminal one line redrawn in place — the walk's
    count, then a bar of the snapshots indexed out of those found; elsewhere (a log, a
    pipe) a line per phase and per quarter of the indexing, never a carriage return."""

    WIDTH = 30

    def __init__(self, name: str, out: TextIO) -> None:
        self.name = name
        self.out = out
        self.tty = out.isatty()
        self.shown: tuple[str, int] = ("", -1)

    def __call__(self, p: ReindexProgress) -> None:
        if p.phase == "index" and p.snapshots_found:
            done = p.snapshots_indexed / p.snapshots_found
            filled = round(done * self.WIDTH)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            text = (
                f"{self.name}: indexing [{bar}] {done:4.0%} "
                f"{p.snapshots_indexed}/{p.snapshots_found} snapshots"
            )
            step = int(done * 4)  # quarters, for a log
        elif p.phase == "walk":
            text, step = f"{self.name}: reading history, {p.snapshots_found} new snapshots", 0
        elif p.phase == "done":
            text = (
                f"{self.name}: indexed {p.snapshots_indexed} of {p.snapshots_found} new "
                f"snapshots ({p.refs} refs)"
            )
            step = 5
        else:
            text, step = f"{self.name}: reading {p.refs} refs", 0
        if self.tty:
            self.out.write("\r\033[K" + text + ("\n" if p.phase == "done" else ""))
        elif (p.phase, step) != self.shown:
            self.out.write(text + "\n")
        self.shown = (p.phase, step)
        self.out.flush()
