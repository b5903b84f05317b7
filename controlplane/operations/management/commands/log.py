from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.applications.models import Application
from controlplane.jobs.store import application_repository
from snapshots_store import StoreError


class Command(BaseCommand):
    help = "Print a branch's history (first-parent by default), newest first, with provenance."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("branch", help="branch name, or a revision (tag, id, rev~n)")
        parser.add_argument("--application", help="default: the only application")
        parser.add_argument("--limit", "-n", type=int, default=20)
        parser.add_argument("--full", action="store_true", help="all parents, not first only")

    def handle(self, *args: Any, **options: Any) -> None:
        apps = Application.objects.all()
        if options["application"]:
            apps = apps.filter(name=options["application"])
        if apps.count() != 1:
            names = sorted(a.name for a in Application.objects.all())
            raise CommandError(f"name the application with --application (one of {names})")
        repo = application_repository(apps.get())
        try:
            entries = repo.log(
                options["branch"], first_parent=not options["full"], limit=options["limit"]
            )
        except StoreError as exc:
            raise CommandError(str(exc)) from None
        for sid, manifest in entries:
            what = f"{manifest.kind:<9} epoch {manifest.epoch:<6} p={manifest.parallelism:<3}"
            self.stdout.write(f"{sid[:12]}  {manifest.created_at[:19]}  {what}")
            provenance = dict(manifest.provenance)
            if provenance:
                detail = ", ".join(f"{k}={v[:16]}" for k, v in sorted(provenance.items()) if v)
                self.stdout.write(f"              {detail}")
