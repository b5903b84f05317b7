"""`manage.py demo`: the main job on the embedded default, end to end.

Generates clickstream input, runs the example job on Spark `local[2]` so that it commits
epochs into the snapshot store, indexes the lineage and serves the control plane.
Running it again resumes the job from its branch head with new input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

NAMESPACE = "clickstream"
BRANCH = "main"


class Command(BaseCommand):
    help = (
        "Run the example clickstream job on the embedded default (Spark local[2], the store at "
        "STORE_URL), index its lineage and serve the control plane."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--epochs", type=int, default=8, help="epochs to run (default 8)")
        parser.add_argument(
            "--records", type=int, default=20_000, help="input records per epoch (default 20000)"
        )
        parser.add_argument("--parallelism", type=int, default=2, help="tasks (default 2)")
        parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
        parser.add_argument(
            "--no-serve", action="store_true", help="stop after the job instead of serving"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["epochs"] < 1 or options["records"] < 1 or options["parallelism"] < 1:
            raise CommandError("--epochs, --records and --parallelism must be positive")
        store_url: str = settings.EPOCHAL_STORE_URL
        input_dir = Path(settings.VAR_DIR) / "demo" / "clickstream-input"
        self.stdout.write(f"store:  {store_url} (namespace {NAMESPACE}, branch {BRANCH})")
        self.stdout.write(f"input:  {input_dir}")
        head = self._run_job(store_url, input_dir, options)
        self._index(store_url)
        self._print_log(store_url, head)
        if options["no_serve"]:
            return
        login = self._ensure_demo_login()
        self.stdout.write(
            self.style.SUCCESS(
                f"\nControl plane: http://127.0.0.1:{options['port']}/  (Ctrl-C to stop)\n"
                f"Admin:         http://127.0.0.1:{options['port']}/admin/  ({login})\n"
                f"Store CLI:     .venv/bin/python -m snapshots_store --store {store_url} "
                f"--namespace {NAMESPACE} log {BRANCH}"
            )
        )
        call_command("runserver", f"127.0.0.1:{options['port']}", use_reloader=False)

    def _run_job(self, store_url: str, input_dir: Path, options: dict[str, Any]) -> str:
        from controlplane.jobs.demo_lineage import build_demo_lineage
        from snapshots_store import Repository

        repo = Repository.open(store_url, NAMESPACE)
        head = repo.read_ref(f"heads/{BRANCH}")
        if head is None:
            lineage = build_demo_lineage(repo, epochs=options["epochs"])
            self.stdout.write(f"committed a demonstration lineage of {lineage.commits} snapshots")
            return lineage.main_head
        self.stdout.write("the store already holds the demonstration lineage")
        return head.target

    def _ensure_demo_login(self) -> str:
        """A local-only admin login for the demo, created once (the server binds 127.0.0.1)."""
        from django.contrib.auth import get_user_model

        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return "log in with your superuser"
        users.objects.create_superuser("admin", "admin@localhost", "epochal-demo")
        return "login admin / epochal-demo — created for this local demo"

    def _index(self, store_url: str) -> None:
        call_command("reindex", application=NAMESPACE, store=store_url, create=True, verbosity=0)
        self.stdout.write(f"indexed the lineage of {NAMESPACE!r} (manage.py reindex)")

    def _print_log(self, store_url: str, head: str) -> None:
        from snapshots_store import Repository

        repo = Repository.open(store_url, NAMESPACE)
        self.stdout.write(f"\nlog {BRANCH} (newest first):")
        for snapshot_id, manifest in repo.log(head, first_parent=True, limit=10):
            self.stdout.write(
                f"  {snapshot_id[:12]}  epoch {manifest.epoch:>4}  {manifest.kind:<8} "
                f"p={manifest.parallelism}  {manifest.created_at}"
            )
