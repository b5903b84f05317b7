"""`manage.py demo`: the main job on the embedded default, end to end.

Generates clickstream input, runs the example session-statistics job (runners/jobs/clickstream.py)
through the epoch-commit engine on Spark `local[2]` so that it commits epochs into the snapshot
store, indexes the lineage and serves the control plane. Running it again adds input and resumes
the job from its branch head.
"""

from __future__ import annotations

import time
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
            "--records", type=int, default=5_000, help="clicks per epoch (default 5000)"
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
        from runners.engine import EpochRunner
        from runners.engine.session import build_spark_session
        from runners.jobs import clickstream
        from snapshots_store import Repository

        repo = Repository.open(store_url, NAMESPACE)
        existing = len(list(input_dir.glob("clicks-*"))) if input_dir.is_dir() else 0
        clickstream.generate(
            str(input_dir), files=existing + options["epochs"], clicks=options["records"]
        )
        self.stdout.write(
            f"input has {existing + options['epochs']} click file(s); starting Spark "
            f"{settings.EPOCHAL_SPARK_MASTER} (about 10 s) …"
        )
        spark = build_spark_session(master=settings.EPOCHAL_SPARK_MASTER, app_name="epochal-demo")
        try:
            runner = EpochRunner(
                spark,
                clickstream.job(str(input_dir)),
                repo=repo,
                branch=BRANCH,
                parallelism=options["parallelism"],
                max_parallelism=128,
            )
            started = time.monotonic()
            results = []
            while len(results) < options["epochs"]:
                res = runner.run_epoch()
                if res is None:
                    break
                results.append(res)
                self.stdout.write(
                    f"  epoch {res.epoch:>4}  {res.records_in:>7} records in  "
                    f"{res.output_rows:>6} sessions out  {res.dead_letters:>3} dead letters  "
                    f"p={res.parallelism}  {res.duration_s:5.2f} s  commit {res.commit_ms:.0f} ms"
                    f"  snapshot {res.snapshot_id[:12]}"
                )
            self.stdout.write(
                f"committed {len(results)} epoch(s) in {time.monotonic() - started:.1f} s"
                + (f" ({runner.stopped_reason})" if runner.stopped_reason else "")
            )
        finally:
            spark.stop()
        head = repo.read_ref(f"heads/{BRANCH}")
        if head is None:
            raise CommandError("the job committed nothing: see the lines above")
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
