"""`manage.py demo`: the whole control plane on the embedded default, with the example job.

Generates clickstream input, registers the example session-statistics job
(runners/jobs/clickstream.py), starts two Celery workers — the control loop (reconciler, run
watch, lineage indexing, autoscaler; with the beat) and the operations, so neither waits for
the other — asks them to start the job — a real PySpark run of the epoch-commit engine on
Spark `local[2]`, launched by the local launcher — prints each epoch as it commits, then
serves the dashboard, the REST API and the admin while a feeder adds input every few seconds,
still printing each new epoch and each operation (the web server's request lines only with
`--request-log`). Its login and URL are printed at the start of every run.

Ctrl-C, SIGTERM (`kill`, a supervisor) and SIGHUP (a closed terminal) all shut the control
plane down: first the workers, then every job's run, each stopped at an epoch boundary with
the reason `stopped by shutdown of the control plane` and its job's desired state kept (a run
the stop could not end is terminated). Running it again brings back every job that should
run — the reconciler starts them from their branch heads; the demo prints a one-line summary
of the history, then only the new epochs. A SIGKILLed demo stops nothing: its workers die
with it (a parent-death signal), the runs go on unwatched and `epochal jobs` shows them as
`unknown (control plane was down)` until the next start finds them running.

``--job pageviews`` runs the event-time example instead (runners/jobs/pageviews.py: views per
page in 5-minute windows sliding by 1 minute; `controlplane.jobs.demo_examples`), on files only,
and prints where to see its windows: the job page (watermark, late records, open windows per
key group) and one line reading the output.

``--source rabbitmq-stream`` publishes the same clicks to the RabbitMQ stream
``epochal-demo-clicks`` (``RABBITMQ_STREAM_URL``, default the local broker's stream plugin on
port 5552) and runs the job on the RabbitMQ Streams source instead of the files;
``--source kafka --topic NAME`` does the same with a Kafka topic (``KAFKA_BOOTSTRAP_SERVERS``,
default the broker `bin/services up` starts on 127.0.0.1:9092) and the Kafka source.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.jobs.demo_examples import (
    CLICKSTREAM,
    EXAMPLES,
    PAGEVIEWS,
    epoch_event_time,
    generate_pageviews,
)

STREAM = "epochal-demo-clicks"
KAFKA_PARTITIONS = 2
LAKE = "clickstream-lake"  # the demo's registered Delta sink
BRANCH = "main"
DEMO_USER = "admin"
DEMO_PASSWORD = "epochal-demo"  # a local-only login: the demo's server binds 127.0.0.1


class Command(BaseCommand):
    help = (
        "Bring the control plane up on the embedded default (SQLite, filesystem broker, local "
        "store, Spark local[2]), start an example job (clickstream by default) and serve the "
        "dashboard."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--job",
            choices=sorted(EXAMPLES),
            default=CLICKSTREAM.entry_point,
            help="the example job: "
            + "; ".join(f"{e.entry_point}: {e.about}" for e in EXAMPLES.values())
            + " (default clickstream)",
        )
        parser.add_argument(
            "--input-batches",
            type=int,
            default=8,
            help="input files to generate before starting (each becomes about one epoch)",
        )
        parser.add_argument(  # the old name of --input-batches, kept so old scripts still run
            "--epochs", type=int, dest="deprecated_epochs", default=None, help=argparse.SUPPRESS
        )
        parser.add_argument(
            "--records", type=int, default=5_000, help="clicks (or views) per input file"
        )
        parser.add_argument("--parallelism", type=int, default=2, help="tasks (default 2)")
        parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
        parser.add_argument(
            "--feed-every",
            type=float,
            default=15.0,
            help="while serving, add an input file every N seconds (0: never); with --job "
            "pageviews, look every N seconds for the view files whose 2 minutes of event time "
            "have passed",
        )
        parser.add_argument(
            "--source",
            choices=["files", "rabbitmq-stream", "kafka"],
            default="files",
            help="where the job reads clicks: JSON-lines files (default), a RabbitMQ stream or "
            "a Kafka topic",
        )
        parser.add_argument(
            "--stream", default=STREAM, help=f"with --source rabbitmq-stream (default {STREAM})"
        )
        parser.add_argument(
            "--topic", default=STREAM, help=f"with --source kafka (default {STREAM})"
        )
        parser.add_argument(
            "--request-log",
            action="store_true",
            help="also print the web server's log line of every HTTP request (off: the "
            "terminal shows epochs and operations)",
        )
        parser.add_argument(
            "--no-serve",
            action="store_true",
            help="stop the jobs and the workers once the input is consumed instead of serving",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["deprecated_epochs"] is not None:
            self.stderr.write(
                "--epochs is deprecated (it counts input batches): use --input-batches"
            )
            options["input_batches"] = options["deprecated_epochs"]
        if min(options["input_batches"], options["records"], options["parallelism"]) < 1:
            raise CommandError("--input-batches, --records and --parallelism must be positive")
        self.options = options
        self.example = EXAMPLES[options["job"]]
        if self.example is PAGEVIEWS and options["source"] != "files":
            raise CommandError(
                "--job pageviews reads generated Parquet files: leave out --source (the "
                "RabbitMQ stream and Kafka sources are for the clickstream job)"
            )
        self._stopping = False
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)  # even when started with SIGINT ignored (&)
        store_url: str = settings.EPOCHAL_STORE_URL
        self.input_dir = self.example.input_dir(Path(settings.VAR_DIR))
        self.stream_url = str(settings.EPOCHAL_DEMO_RABBITMQ_STREAM_URL)
        self.kafka = str(settings.EPOCHAL_DEMO_KAFKA_BOOTSTRAP_SERVERS)
        app = self.example.application
        self.stdout.write(f"store:  {store_url} (namespace {app}, branch {BRANCH})")
        if options["source"] == "kafka":
            self._check_kafka()
            self.stream = options["topic"]
            self.stdout.write(f"input:  Kafka topic {self.stream} at {self.kafka}")
            job_args = {"source": "kafka", "url": self.kafka, "streams": [self.stream]}
        elif options["source"] == "rabbitmq-stream":
            self._check_stream_endpoint()
            self.stream = options["stream"]
            self.stdout.write(f"input:  RabbitMQ stream {self.stream} at {self._endpoint_text()}")
            job_args = {
                "source": "rabbitmq-stream",
                "url": self.stream_url,
                "streams": [self.stream],
            }
        else:
            self.stdout.write(f"input:  {self.input_dir}")
            job_args = {"directory": str(self.input_dir)}
        self.stdout.write(
            f"broker: {settings.CELERY_BROKER_URL}   database: "
            f"{settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}"
        )
        existing = self._files()
        self._generate(existing + options["input_batches"])
        config: dict[str, Any] = {}
        if self.example is CLICKSTREAM:
            self._register_lake()
            config = {"sinks": [LAKE]}
        else:
            self._print_windows_output(store_url)
        call_command(
            "register",
            app,
            "--job",
            self.example.entry_point,
            "--job-args",
            json.dumps(job_args),
            "--config",
            json.dumps(config),
            "--job-name",
            self.example.job,
            "--parallelism",
            str(options["parallelism"]),
            stdout=self.stdout,
        )
        login = self._ensure_demo_login()
        if not options["no_serve"]:
            self.stdout.write(f"login:  {login}   at {self._base_url()}/ once the job runs")
        seen = self._summarise_history()
        workers = self._start_workers()
        try:
            self._start_job()
            self._follow_commits(seen, timeout_s=600)
            spark_ui = self._spark_ui()
            self.stdout.write(f"spark ui: {spark_ui}")
            call_command("reindex", application=app, verbosity=1, stdout=self.stdout)
            if options["no_serve"]:
                return
            self._serve(login, seen, spark_ui)
        except KeyboardInterrupt:
            pass  # a signal (see _on_signal): stop the jobs and the workers below
        finally:
            self._shutdown(workers)

    def _register_lake(self) -> Path:
        """The demo's sink: a Delta table under var/ the job writes every epoch to (docs/sinks.md);
        printed with a one-line way to read it."""
        from controlplane.applications.sinks import sink_register

        path = Path(settings.VAR_DIR) / "demo" / "clickstream-lake"
        sink_register(
            name=LAKE,
            kind="delta",
            config={"path": str(path)},
            description="the demo's Delta table",
        )
        self.stdout.write(f"output: Delta table {path} (sink {LAKE}); read it with")
        self.stdout.write(
            f'        .venv/bin/python -c "import deltalake; '
            f"print(deltalake.DeltaTable('{path}').to_pandas())\""
        )
        return path

    def _print_windows_output(self, store_url: str) -> None:
        """Where the pageviews job's windows are: its output on the branch, read in one line."""
        app = self.example.application
        self.stdout.write(
            f"output: one row per page and closed window on branch {BRANCH} of {app} in the "
            "store (the engine's output); read it with"
        )
        self.stdout.write(
            '        .venv/bin/python -c "from runners.engine import read_output; '
            "from snapshots_store import Repository; "
            f"print(read_output(Repository.open('{store_url}', '{app}'), '{BRANCH}')"
            '.to_pandas())"'
        )

    # -- signals -----------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        """The first Ctrl-C, SIGTERM or SIGHUP interrupts whatever the demo is doing (like
        Ctrl-C); later ones, while the demo stops the workers and the runs, are noted only."""
        if self._stopping:
            self._say(f"{signal.Signals(signum).name} received: still stopping …")
            return
        self._stopping = True
        self._say(f"\n{signal.Signals(signum).name} received: stopping")
        raise KeyboardInterrupt

    def _say(self, line: str) -> None:
        """Print, unless the terminal is gone (after SIGHUP): stopping must go on."""
        with contextlib.suppress(OSError, ValueError):
            self.stdout.write(line)

    # -- input -------------------------------------------------------------------------------

    def _files(self) -> int:
        """Input batches so far (files, or batches published to the stream or topic)."""
        if self.options["source"] != "files":
            counts = self._published()
            return len(counts)
        return self.example.files(self.input_dir)

    def _generate(self, files: int) -> None:
        from runners.jobs import clickstream

        if self.example is PAGEVIEWS:
            generate_pageviews(
                self.input_dir,
                Path(settings.VAR_DIR),
                batches=self.options["input_batches"],
                views=self.options["records"],
            )
            return
        if self.options["source"] == "files":
            clickstream.generate(str(self.input_dir), files=files, clicks=self.options["records"])
            return
        publish = self._publisher()
        counts = self._published()
        batches = clickstream.click_batches(files, clicks=self.options["records"])
        for i, rows in enumerate(batches):
            if i >= len(counts):  # publish each batch once, across runs of the demo
                publish(rows)
                counts.append(len(rows))
                self._published_path().write_text(json.dumps(counts))

    def _publisher(self) -> Any:
        """Create the stream or topic (if missing); a function publishing a batch to it."""
        if self.options["source"] == "kafka":
            from runners.engine import kafka_client

            kafka_client.create_topic(self.kafka, self.stream, KAFKA_PARTITIONS)
            return lambda rows: kafka_client.publish(
                self.kafka, self.stream, rows, key_field="user"
            )
        from runners.engine.rabbitmq_stream import create_stream, publish

        create_stream(self.stream_url, self.stream)
        return lambda rows: publish(self.stream_url, self.stream, rows)

    def _published_path(self) -> Path:
        return Path(settings.VAR_DIR) / "demo" / f"{self.stream}.batches.json"

    def _published(self) -> list[int]:
        path = self._published_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        return list(json.loads(path.read_text())) if path.exists() else []

    def _input_records(self) -> int:
        if self.options["source"] != "files":
            return sum(self._published())
        return self.example.input_records(self.input_dir)

    def _endpoint_text(self) -> str:
        from runners.engine.rabbitmq_stream import Endpoint

        e = Endpoint.parse(self.stream_url)
        return f"{e.host}:{e.port} (vhost {e.vhost})"

    def _check_kafka(self) -> None:
        from runners.engine.kafka_client import check_bootstrap

        try:
            first = check_bootstrap(self.kafka).split(",")[0]
        except ValueError as exc:
            raise CommandError(f"KAFKA_BOOTSTRAP_SERVERS: {exc}") from None
        host, _, port = first.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
        except OSError as exc:
            raise CommandError(
                f"--source kafka: no Kafka broker answers at {first} ({exc}); start one with "
                "`bin/services up` (or set KAFKA_BOOTSTRAP_SERVERS), or run the demo on files "
                "(the default)"
            ) from None

    def _check_stream_endpoint(self) -> None:
        from runners.engine.rabbitmq_stream import Endpoint

        try:
            endpoint = Endpoint.parse(self.stream_url)
        except ValueError as exc:
            raise CommandError(f"RABBITMQ_STREAM_URL: {exc}") from None
        try:
            socket.create_connection((endpoint.host, endpoint.port), timeout=2).close()
        except OSError as exc:
            raise CommandError(
                f"--source rabbitmq-stream: nothing answers at {endpoint.host}:{endpoint.port} "
                f"({exc}); enable the plugin with `rabbitmq-plugins enable rabbitmq_stream` or "
                "set RABBITMQ_STREAM_URL, or run the demo on files (the default)"
            ) from None

    # -- processes ---------------------------------------------------------------------------

    def _start_workers(self) -> list[subprocess.Popen[bytes]]:
        """Two Celery workers, so that the control loop never waits behind an operation
        (`controlplane.operations.workers`)."""
        from controlplane.operations.workers import start_workers

        demo_dir = Path(settings.VAR_DIR) / "demo"
        demo_dir.mkdir(parents=True, exist_ok=True)
        for queue, what in (
            ("control", "reconciler, run watch, lineage index, autoscaler (beat)"),
            ("operations", "start, stop, rescale, rollback …"),
        ):
            log_path = demo_dir / f"worker-{queue}.log"
            self.stdout.write(f"worker: Celery worker for queue {queue} — {what}, log {log_path}")
        workers = start_workers(
            name=f"demo-{os.getpid()}",
            log_dir=demo_dir,
            beat_schedule=str(Path(settings.VAR_DIR) / "celerybeat-schedule"),
            cwd=Path(settings.BASE_DIR),
            preexec_fn=_die_with_parent,  # a demo killed outright (SIGKILL) takes them along
        )
        return workers

    def _start_job(self) -> None:
        from controlplane.cli.operations import follow
        from controlplane.errors import Conflict
        from controlplane.jobs.selectors import job_get
        from controlplane.operations.kinds.common import job_is_running
        from controlplane.operations.selectors import operation_active_for_job
        from controlplane.operations.services import operation_request

        job = job_get(name=self.example.job)
        # After the demo's own shutdown the reconciler starts the job again by itself (its
        # desired state is still running): follow that start rather than asking twice.
        op = operation_active_for_job(job_id=job.pk)
        if op is None and job_is_running(job):
            self.stdout.write(f"job {self.example.job} is already running")
            return
        if op is None:
            try:
                op = operation_request(
                    kind="start",
                    application=job.application,
                    job=job,
                    via="cli",
                    reason="manage.py demo",
                ).operation
            except Conflict:
                op = operation_active_for_job(job_id=job.pk)
                if op is None:  # the reconciler's start has already launched it
                    self.stdout.write(f"job {self.example.job} is already running")
                    return
        self.stdout.write(
            f"starting job {self.example.job} (operation {op.pk}); Spark takes about 10 s to "
            "come up …"
        )
        op = follow(op, self.stdout.write, timeout_s=300)
        if op.state != "succeeded":
            raise CommandError(f"the job did not start: {op.error_message or op.state}")
        self.stdout.write("start succeeded")

    def _repository(self) -> Any:
        from controlplane.jobs.selectors import job_get
        from controlplane.jobs.store import job_repository

        return job_repository(job_get(name=self.example.job))

    def _summarise_history(self) -> set[str]:
        """On a restart, one line about the branch's history instead of every epoch again;
        the snapshots already there (not printed again)."""
        repo = self._repository()
        ref = repo.read_ref(f"heads/{BRANCH}")
        if ref is None:
            return set()
        history = list(repo.log(ref.target, first_parent=True))
        head = history[0][1]
        self.stdout.write(
            f"resuming: {BRANCH} has {len(history)} commits, head epoch {head.epoch} "
            f"({head.kind}, p={head.parallelism}, snapshot {ref.target[:12]}); "
            f"new epochs follow (`.venv/bin/epochal log {BRANCH} --application "
            f"{self.example.application}` "
            "shows the history)"
        )
        return {sid for sid, _ in history}

    def _print_new_commits(self, repo: Any, seen: set[str]) -> tuple[str | None, int]:
        """Print the branch's commits not printed yet, oldest first; the head and the input
        records its history consumed."""
        ref = repo.read_ref(f"heads/{BRANCH}")
        if ref is None:
            return None, 0
        consumed = 0
        new = []
        for sid, m in repo.log(ref.target, first_parent=True):
            consumed += int(m.stats.get("records_in", 0)) + int(m.stats.get("dead_letters", 0))
            if sid not in seen:
                seen.add(sid)
                new.append((sid, m))
        for sid, m in reversed(new):
            s = m.stats
            self._say(
                f"  epoch {m.epoch:>4}  {m.kind:<8} {int(s.get('records_in', 0)):>7} records "
                f"in  {int(s.get('output_rows', 0)):>6} {self.example.rows_out} out  "
                f"{int(s.get('dead_letters', 0)):>3} dead letters  p={m.parallelism}  "
                f"snapshot {sid[:12]}{epoch_event_time(s, m.extra)}"
            )
        return ref.target, consumed

    def _follow_commits(self, seen: set[str], *, timeout_s: float) -> str:
        """Print each epoch as it commits until the job has consumed all input; the head."""
        repo = self._repository()
        total = self._input_records()
        started = time.monotonic()
        while True:
            head, consumed = self._print_new_commits(repo, seen)
            if head is not None and consumed >= total:
                self.stdout.write(f"the job has consumed all {total} input records")
                return head
            if time.monotonic() - started > timeout_s:
                raise CommandError(
                    f"the job consumed {consumed} of {total} records in {timeout_s:g} s; see "
                    f"`.venv/bin/epochal jobs` and the run log under {settings.VAR_DIR}/runs/"
                )
            time.sleep(1)

    def _base_url(self) -> str:
        return f"http://127.0.0.1:{self.options['port']}"

    def _spark_ui(self) -> str:
        """The running job's Spark UI link (through the control plane), once its driver has
        reported where the UI listens (the run watch records it; looked up here too)."""
        from controlplane.jobs.selectors import job_current_run, job_get
        from controlplane.jobs.services import run_refresh
        from controlplane.jobs.spark_ui import run_spark_ui_text

        run = job_current_run(job_get(name=self.example.job))
        deadline = time.monotonic() + 60
        while run is not None and run.live and run.spark_ui_url is None:
            run = run_refresh(run)
            if run.spark_ui_url is not None or time.monotonic() > deadline:
                break
            time.sleep(1)
        return run_spark_ui_text(run, self._base_url())

    def _serve(self, login: str, seen: set[str], spark_ui: str) -> None:
        port = self.options["port"]
        base = self._base_url()
        job, app = self.example.job, self.example.application
        windows, arrives = "", f"a new input file arrives every {self.options['feed_every']:g} s"
        if self.example is PAGEVIEWS:
            windows = (
                f"Windows:    {base}/jobs/{job}/  (watermark and its lag, late records per "
                "epoch, open windows per key group; the output line above reads the closed "
                "ones)\n"
            )
            arrives = "a view file arrives as its 2 minutes of event time pass"
        self.stdout.write(
            self.style.SUCCESS(
                f"\nDashboard:  {base}/            ({login})\n"
                f"{windows}"
                f"REST API:   {base}/api/  (OpenAPI UI {base}/api/docs/)\n"
                f"Admin:      {base}/admin/\n"
                f"Metrics:    {base}/metrics\n"
                f"Spark UI:   {spark_ui}\n"
                f"CLI:        .venv/bin/epochal jobs | rescale {job} -p 3 | "
                f"rollback {job} --to <snapshot> | log {BRANCH} --application {app}\n"
                f"The job keeps running; {arrives} and each new epoch and operation is printed "
                "below (--request-log adds the web server's requests). Ctrl-C (or SIGTERM, "
                "SIGHUP) stops every job at an epoch boundary, then the workers; the next "
                "start of the demo starts them again."
            )
        )
        if not self.options["request_log"]:
            # errors (4xx, 5xx) are warnings and still printed; 200s and 304s are not. A
            # filter, not a level: loading the WSGI application configures logging again,
            # which resets the logger's level but keeps its filters.
            logging.getLogger("django.server").addFilter(_warnings_only)
        stop = threading.Event()
        if self.options["feed_every"] > 0:
            threading.Thread(target=self._feed, args=(stop,), daemon=True).start()
        repo = self._repository()
        threading.Thread(target=self._watch, args=(repo, seen, stop), daemon=True).start()
        try:
            # the demo runs without DEBUG (bin/demo): no debug page ever reaches a browser,
            # and the server itself hands out the static files (--insecure)
            call_command(
                "runserver", f"127.0.0.1:{port}", use_reloader=False, insecure_serving=True
            )
        finally:
            stop.set()

    def _feed(self, stop: threading.Event) -> None:
        while not stop.wait(self.options["feed_every"]):
            self._generate(self._files() + 1)

    def _watch(self, repo: Any, seen: set[str], stop: threading.Event) -> None:
        """While serving: print each new epoch (and rescale, rollback …) as it commits, and
        each operation of any job as it is requested, moves to another phase and ends."""
        from django.db import connection

        shown: dict[str, tuple[str, str]] = {}
        self._print_operations(shown, quiet=True)  # the ones before now: not printed
        while not stop.wait(1.0):
            try:
                self._print_new_commits(repo, seen)
            except Exception as exc:  # a store read racing a commit: try again next second
                self._say(f"  (could not read the branch: {exc})")
            try:
                self._print_operations(shown)
            except Exception as exc:
                self._say(f"  (could not read the operations: {exc})")
        connection.close()

    def _print_operations(self, shown: dict[str, tuple[str, str]], *, quiet: bool = False) -> None:
        from controlplane.operations.models import Operation

        recent = Operation.objects.select_related("job", "requested_by").order_by("-created_at")
        for op in reversed(list(recent[:20])):
            now = (op.state, op.current_phase or "")
            if shown.get(str(op.pk)) == now:
                continue
            first = str(op.pk) not in shown
            shown[str(op.pk)] = now
            if quiet:
                continue
            target = op.job.name if op.job else op.application.name
            if first:
                who = op.requested_by.get_username() if op.requested_by else "—"
                self._say(
                    f"  operation {op.kind:<9} {str(op.pk)[:8]}  on {target}, asked by {who} "
                    f"via {op.requested_via}"
                )
            if op.state in ("succeeded", "failed", "cancelled"):
                took = ""
                if op.finished_at and op.started_at:
                    took = f" in {(op.finished_at - op.started_at).total_seconds():.1f} s"
                error = f": {op.error_message}" if op.error_message else ""
                self._say(f"  operation {op.kind:<9} {str(op.pk)[:8]}  {op.state}{took}{error}")
            elif op.current_phase:
                self._say(f"  operation {op.kind:<9} {str(op.pk)[:8]}  {op.current_phase} …")

    def _shutdown(self, workers: list[subprocess.Popen[bytes]]) -> None:
        """The control plane goes down: first its workers (so no reconciler takes a run's
        end for the job's), then every job run, stopped at an epoch boundary with the reason
        recorded and each job's desired state kept — the next start of the demo brings back
        every job that was running, not only the demo's own."""
        from controlplane.jobs.services import runs_stop_for_shutdown

        try:
            for worker in workers:
                if worker.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(worker.pid, signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait()
            self._say("workers stopped")
        finally:
            self._say("stopping every job run at its next epoch boundary …")
            runs = runs_stop_for_shutdown(deadline_s=60, say=self._say)
            self._say(
                f"stopped {len(runs)} run(s) at an epoch boundary; the jobs start again from "
                "their heads when the control plane is back"
            )
            self._terminate_leftover_runs()

    def _terminate_leftover_runs(self) -> None:
        """A job run the shutdown's stop did not end (it timed out, or failed):
        SIGTERM then SIGKILL its process group, so nothing of the demo outlives it."""
        import json

        from runners.local import group_members

        for pid_file in (Path(settings.VAR_DIR) / "runs").glob("*/pid"):
            try:
                pid = int(json.loads(pid_file.read_text())["pid"])
            except (OSError, ValueError, KeyError):
                continue
            if not group_members(pid):
                continue
            self._say(f"run {pid_file.parent.name} still running: terminating it")
            for signum, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signum)
                deadline = time.monotonic() + wait_s
                while group_members(pid) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if not group_members(pid):
                    break

    # -- output ------------------------------------------------------------------------------

    def _ensure_demo_login(self) -> str:
        """The demo's local-only admin login (the server binds 127.0.0.1), created on the first
        run; what to log in with, user and password, on every run."""
        from django.contrib.auth import get_user_model

        users = get_user_model()
        demo = users.objects.filter(username=DEMO_USER, is_superuser=True).first()
        if demo is not None and demo.check_password(DEMO_PASSWORD):
            return f"user {DEMO_USER}, password {DEMO_PASSWORD}"
        other = users.objects.filter(is_superuser=True).order_by("pk").first()
        if other is not None:
            return f"user {other.get_username()} with the password you gave it"
        users.objects.create_superuser(DEMO_USER, "admin@localhost", DEMO_PASSWORD)
        return f"user {DEMO_USER}, password {DEMO_PASSWORD} (created for this local demo)"


def _warnings_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def _die_with_parent() -> None:
    """In a child before it execs: have the kernel send SIGTERM when the demo dies (Linux's
    PR_SET_PDEATHSIG), so a SIGKILLed demo leaves no worker behind."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
