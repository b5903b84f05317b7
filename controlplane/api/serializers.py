"""Input parsing and output rendering only: no queries beyond what the instance already holds."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from controlplane.accounts.models import TOKEN_STATES
from controlplane.accounts.roles import ROLES, user_role
from controlplane.api.schema import REF_PATTERN
from controlplane.applications.models import (
    JOB_NAME_PATTERN,
    MAX_PARALLELISM_LIMIT,
    NAME_PATTERN,
)
from controlplane.jobs.models import DesiredState, JobState, RunPhase
from controlplane.jobs.selectors import ShownState, job_shown_state
from controlplane.jobs.spark_conf import spark_conf_schema
from controlplane.lineage.event_time import NO_EVENT_TIME, event_time_fields
from controlplane.lineage.models import COMMIT_KINDS
from controlplane.lineage.sink_status import STATUSES as SINK_STATUSES
from controlplane.operations.models import OperationKind, OperationState
from controlplane.operations.registry import SPECS
from controlplane.patterns import WholeRegexField
from runners.launchers import RUNNERS


def absolute(request: Any, name: str, *args: Any) -> str:
    path = reverse(f"api:{name}", args=args)
    return request.build_absolute_uri(path) if request is not None else path


def _json_type(field: serializers.Field) -> tuple[type, ...] | None:
    """The JSON types `field` takes as they are (None: any); no coercion of "3" to 3."""
    if isinstance(field, serializers.BooleanField):
        return (bool,)
    if isinstance(field, serializers.IntegerField):
        return (int,)
    if isinstance(field, serializers.FloatField | serializers.DecimalField):
        return (int, float)
    if isinstance(field, serializers.ChoiceField):
        kinds = {type(choice) for choice in field.choices}
        return tuple(kinds) if kinds else None
    if isinstance(field, serializers.CharField):
        return (str,)
    if isinstance(field, serializers.DictField | serializers.Serializer):
        return (dict,)
    if isinstance(field, serializers.ListField | serializers.ListSerializer):
        return (list,)
    return None


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
_TYPE_NAMES.update({dict: "an object", list: "an array"})


class StrictSerializer(serializers.Serializer):
    # The base of every request body: unknown fields are a 400 (like Kubernetes' strict field
    # validation), and each field takes its JSON type only ("3" is not an integer, 1 is not a
    # boolean, 3 is not a string). (A comment, not a docstring: the schema shows docstrings.)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            if isinstance(field, serializers.CharField):
                field.trim_whitespace = False  # " a" is not "a": what was sent is what counts

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            writable = {name for name, f in self.fields.items() if not f.read_only}
            errors: dict[str, list[str]] = {}
            for name in sorted(set(data) - writable, key=str):
                errors[str(name)] = [f"unknown field; this request takes {sorted(writable)}"]
            for name in sorted(set(data) & writable):
                value, field = data[name], self.fields[name]
                kinds = _json_type(field)
                if value is None or kinds is None:
                    continue
                if isinstance(value, bool) and bool not in kinds:
                    ok = False
                else:
                    ok = isinstance(value, kinds)
                if not ok:
                    wanted = " or ".join(dict.fromkeys(_TYPE_NAMES[k] for k in kinds))
                    errors[name] = [f"must be {wanted}, not {type(value).__name__} {value!r}"]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class ContextSerializer(serializers.Serializer):
    @property
    def request(self) -> Any:
        return self.context.get("request")


# -- applications and versions --------------------------------------------------------------


class ApplicationSerializer(ContextSerializer):
    name = serializers.CharField()
    url = serializers.SerializerMethodField()
    store = serializers.CharField(
        source="store.name",
        allow_null=True,
        default=None,
        help_text="Registered store; null: STORE_URL.",
    )
    store_namespace = serializers.CharField()
    max_parallelism = serializers.IntegerField()
    description = serializers.CharField()
    created_at = serializers.DateTimeField()

    def get_url(self, obj: Any) -> str:
        return absolute(self.request, "application-detail", obj.name)


class ApplicationCreateSerializer(StrictSerializer):
    name = WholeRegexField(NAME_PATTERN, max_length=100)
    store_namespace = WholeRegexField(
        NAME_PATTERN, max_length=100, required=False, help_text="Defaults to the name."
    )
    max_parallelism = serializers.IntegerField(
        min_value=1, max_value=MAX_PARALLELISM_LIMIT, default=128
    )


class VersionSerializer(ContextSerializer):
    number = serializers.IntegerField()
    url = serializers.SerializerMethodField()
    application = serializers.CharField(source="application.name")
    job = serializers.CharField(
        help_text="The job the version runs: an entry-point name of group epochal.jobs."
    )
    code_version = serializers.CharField()
    config = serializers.DictField()
    source_snapshot_id = serializers.CharField(help_text="Set on versions made by a fork.")
    parent = serializers.IntegerField(source="parent.number", allow_null=True, default=None)
    reason = serializers.CharField()
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)
    created_at = serializers.DateTimeField()

    def get_url(self, obj: Any) -> str:
        return absolute(self.request, "version-detail", obj.application.name, obj.number)


class VersionCreateSerializer(StrictSerializer):
    job = WholeRegexField(
        JOB_NAME_PATTERN,
        max_length=100,
        help_text="Name of a job registered as an entry point of group epochal.jobs by an "
        "installed package (GET /api/entry-points/); a module:attr reference is refused.",
    )
    code_version = serializers.CharField(max_length=255, required=False, default="")
    config = serializers.DictField(
        required=False, default=dict, help_text="Launcher settings; see docs/api.md."
    )
    reason = serializers.CharField(required=False, default="", allow_blank=True)


# -- lineage -------------------------------------------------------------------------------


class SnapshotSummarySerializer(ContextSerializer):
    snapshot_id = serializers.CharField()
    url = serializers.SerializerMethodField()
    branch = serializers.CharField()
    epoch = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=COMMIT_KINDS)
    parallelism = serializers.IntegerField()
    max_parallelism = serializers.IntegerField()
    code_version = serializers.CharField()
    config_hash = serializers.CharField()
    operation_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    generation = serializers.IntegerField()
    parents = serializers.ListField(child=serializers.CharField(), source="parent_ids")

    def get_url(self, obj: Any) -> str:
        return absolute(
            self.request, "snapshot-detail", self.context["application"], obj.snapshot_id
        )


def snapshot_url_prefix(request: Any, application: str) -> str:
    """`…/snapshots/` of `application`: a page's URLs are this plus id plus `/` (one reverse
    per page, not per row)."""
    marker = "0" * 64
    return absolute(request, "snapshot-detail", application, marker).removesuffix(f"{marker}/")


def snapshot_summaries(items: Any, url_prefix: str) -> list[dict[str, Any]]:
    """What `SnapshotSummarySerializer` renders, built directly: pages of hundreds of
    snapshots are the API's hottest path, and DRF's per-field machinery was most of their
    time (measured with bench.api)."""
    return [
        {
            "snapshot_id": s.snapshot_id,
            "url": f"{url_prefix}{s.snapshot_id}/",
            "branch": s.branch,
            "epoch": s.epoch,
            "kind": s.kind,
            "parallelism": s.parallelism,
            "max_parallelism": s.max_parallelism,
            "code_version": s.code_version,
            "config_hash": s.config_hash,
            "operation_id": s.operation_id,
            "created_at": _iso(s.created_at),
            "generation": s.generation,
            "parents": list(s.parent_ids),
        }
        for s in items
    ]


def snapshot_summaries_json(rows: Sequence[tuple[str, str]], url_prefix: str) -> str:
    """`snapshot_summaries` as JSON array text, from rows of (snapshot id, the JSON text of
    the summary's members after `url`) that PostgreSQL built (`snapshot_log_page_json`)."""
    prefix = json.dumps(url_prefix, ensure_ascii=False)[:-1]  # the opening quote, no closing
    items = []
    for sid, rest in rows:
        if not _PLAIN_ID.fullmatch(sid):  # ids are 64-hex; anything else is escaped
            quoted = json.dumps(sid, ensure_ascii=False)
            url = json.dumps(f"{url_prefix}{sid}/", ensure_ascii=False)
            items.append(f'{{"snapshot_id":{quoted},"url":{url},{rest}')
        else:
            items.append(f'{{"snapshot_id":"{sid}","url":{prefix}{sid}/",{rest}')
    return "[" + ",".join(items) + "]"


_PLAIN_ID = re.compile(r"[0-9a-f]{64}")


def _iso(value: Any) -> str:
    text: str = value.isoformat()
    return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text


class EventTimeFields(serializers.Serializer):
    """`watermark_ms`, `watermark_lag_s`, `late_records` of one commit (a job's head, a
    snapshot): what `event_time(obj)` gives (controlplane.lineage.event_time)."""

    watermark_ms = serializers.SerializerMethodField(
        help_text="Event-time jobs: the watermark (ms since the Unix epoch, UTC) after the "
        "commit (manifest stat `watermark_ms`); null without event time, before the first "
        "event time and on a commit that does not record it (a rescale's or a rollback's; "
        "a job's head has it again after its next epoch)."
    )
    watermark_lag_s = serializers.SerializerMethodField(
        help_text="Seconds the watermark trailed the wall clock when the commit was made (its "
        "`created_at` minus `watermark_ms`); null with `watermark_ms`. The lag now is the "
        "current time minus `watermark_ms` (/metrics: epochal_job_watermark_lag_seconds)."
    )
    late_records = serializers.SerializerMethodField(
        help_text="Event-time jobs: records the epoch dropped as later than the watermark it "
        "applied (dead letters with reason `late`); null without event time."
    )

    def event_time(self, obj: Any) -> dict[str, Any]:
        raise NotImplementedError

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_watermark_ms(self, obj: Any) -> Any:
        return self.event_time(obj)["watermark_ms"]

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_watermark_lag_s(self, obj: Any) -> Any:
        return self.event_time(obj)["watermark_lag_s"]

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_late_records(self, obj: Any) -> Any:
        return self.event_time(obj)["late_records"]


class SnapshotDetailSerializer(EventTimeFields, SnapshotSummarySerializer):
    offsets = serializers.DictField(child=serializers.DictField(child=serializers.IntegerField()))
    stats = serializers.DictField(child=serializers.FloatField())
    provenance = serializers.DictField(child=serializers.CharField())
    manifest = serializers.SerializerMethodField(
        help_text="Fields only the store holds (null when the store no longer has the manifest)."
    )

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "properties": {
                "key_groups": {"type": "integer", "description": "key groups with state"},
                "state_chunks": {"type": "integer"},
                "outputs": {"type": "array", "items": {"type": "string"}},
                "processing_time_ms": {"type": "integer", "nullable": True},
                "extra": {"type": "object", "additionalProperties": True},
            },
        }
    )
    def get_manifest(self, obj: Any) -> dict[str, Any] | None:
        return self.context.get("manifest")

    sinks = serializers.SerializerMethodField(
        help_text="Per sink of the job on the snapshot's branch: whether its destination holds "
        "the snapshot's epoch, from what the commits recorded (no destination is asked; "
        "docs/sinks.md). `written`: a later commit shows it there; `pending`: not shown yet; "
        "`abandoned`: off the branch's first-parent chain (a rollback left it); "
        "`abandoned_published`: off the chain, and a log sink had published its records, "
        "which stay. A sink with no part in the snapshot is left out."
    )

    @extend_schema_field(
        {
            "type": "object",
            "additionalProperties": {"type": "string", "enum": list(SINK_STATUSES)},
        }
    )
    def get_sinks(self, obj: Any) -> dict[str, str]:
        return dict(self.context.get("sinks") or {})

    def event_time(self, obj: Any) -> dict[str, Any]:
        return event_time_fields(obj.stats, obj.created_at)


class KeyGroupChangeSerializer(serializers.Serializer):
    key_group = serializers.IntegerField()
    old_chunks = serializers.ListField(child=serializers.CharField())
    new_chunks = serializers.ListField(child=serializers.CharField())
    old_size = serializers.IntegerField(allow_null=True)
    new_size = serializers.IntegerField(allow_null=True)


class OffsetChangeSerializer(serializers.Serializer):
    source = serializers.CharField()
    partition = serializers.CharField()
    old = serializers.IntegerField(allow_null=True)
    new = serializers.IntegerField(allow_null=True)
    advanced = serializers.IntegerField()


class SnapshotDiffSerializer(serializers.Serializer):
    old = serializers.CharField(allow_null=True, help_text="null: compared with nothing (a root).")
    new = serializers.CharField()
    added = KeyGroupChangeSerializer(many=True)
    changed = KeyGroupChangeSerializer(many=True)
    removed = KeyGroupChangeSerializer(many=True)
    offsets = OffsetChangeSerializer(many=True)
    parallelism = serializers.ListField(child=serializers.IntegerField())
    max_parallelism = serializers.ListField(child=serializers.IntegerField())
    outputs_added = serializers.ListField(child=serializers.CharField())
    outputs_removed = serializers.ListField(child=serializers.CharField())


class BranchSerializer(serializers.Serializer):
    name = serializers.CharField()
    head = serializers.CharField(source="head.snapshot_id", allow_null=True, default=None)
    head_epoch = serializers.IntegerField(source="head.epoch", allow_null=True, default=None)
    reflog_seq = serializers.IntegerField()


class TagSerializer(serializers.Serializer):
    name = serializers.CharField()
    target = serializers.CharField(source="target.snapshot_id", allow_null=True, default=None)
    target_epoch = serializers.IntegerField(source="target.epoch", allow_null=True, default=None)
    reflog_seq = serializers.IntegerField()


class GraphEdgeSerializer(serializers.Serializer):
    child = serializers.CharField()
    parent = serializers.CharField()
    position = serializers.IntegerField()


# -- jobs and runs -----------------------------------------------------------------------------


class RunSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    runner = serializers.CharField()
    parallelism = serializers.IntegerField()
    phase = serializers.ChoiceField(choices=RunPhase.choices)
    reason = serializers.CharField()
    operation = serializers.UUIDField(source="operation_id", allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class JobSerializer(ContextSerializer):
    name = serializers.CharField()
    url = serializers.SerializerMethodField()
    application = serializers.CharField(source="application.name")
    version = serializers.IntegerField(source="version.number")
    branch = serializers.CharField()
    parallelism = serializers.IntegerField()
    runner = serializers.CharField(source="effective_runner")
    state = serializers.ChoiceField(choices=JobState.choices)
    desired_state = serializers.ChoiceField(choices=DesiredState.choices)
    status_reason = serializers.CharField()
    observed_state = serializers.SerializerMethodField(
        help_text="The state as far as anyone knows: `state`, or `unknown` when the job should "
        "be running but the control plane has not watched its run lately (it was down)."
    )
    observed_reason = serializers.SerializerMethodField(
        help_text="Why `observed_state` is what it is (`status_reason`, or why it is unknown)."
    )
    restarts = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_url(self, obj: Any) -> str:
        return absolute(self.request, "job-detail", obj.name)

    def get_observed_state(self, obj: Any) -> str:
        return self._shown(obj).state

    def get_observed_reason(self, obj: Any) -> str:
        return self._shown(obj).reason

    def _shown(self, job: Any) -> ShownState:
        """The view puts the job's shown state (a detail) or when the runs were last watched
        (`jobs.selectors.runs_watched_at`, read once for a list) in the context."""
        shown = self.context.get("shown")
        if shown is not None:
            return shown  # type: ignore[no-any-return]
        return job_shown_state(job, watched_at=self.context["watched_at"])


@extend_schema_field(spark_conf_schema())
class SparkConfField(serializers.DictField):
    """An operator's Spark settings: the allowed keys and bounds are in the schema."""


class JobCreateSerializer(StrictSerializer):
    name = WholeRegexField(NAME_PATTERN, max_length=100)
    application = WholeRegexField(NAME_PATTERN, max_length=100)
    version = serializers.IntegerField(
        min_value=1, required=False, help_text="Version number; default: the newest."
    )
    branch = WholeRegexField(REF_PATTERN, max_length=255, default="main")
    parallelism = serializers.IntegerField(min_value=1, max_value=MAX_PARALLELISM_LIMIT, default=2)
    runner = serializers.ChoiceField(choices=["", *RUNNERS], default="")
    follow = serializers.BooleanField(default=True)
    max_restarts = serializers.IntegerField(min_value=0, max_value=1000, default=5)
    restart_backoff_s = serializers.IntegerField(min_value=0, max_value=86400, default=10)
    spark_conf = SparkConfField(
        required=False,
        default=dict,
        help_text="Spark resource settings over the version's: spark.executor.instances, "
        "spark.executor.cores, spark.executor.memory, spark.driver.cores, spark.driver.memory, "
        "spark.sql.shuffle.partitions, spark.default.parallelism (string values within bounds; "
        "docs/security.md#code-and-places). Any other key is a 400 naming it.",
    )


class LogsSerializer(serializers.Serializer):
    run_id = serializers.CharField(allow_null=True)
    tail = serializers.IntegerField()
    text = serializers.CharField()


# -- operations ------------------------------------------------------------------------------


class PhaseSerializer(serializers.Serializer):
    name = serializers.CharField()
    state = serializers.CharField()
    started_at = serializers.CharField(allow_null=True)
    finished_at = serializers.CharField(allow_null=True)
    progress = serializers.FloatField()
    detail = serializers.CharField(allow_blank=True)


class OperationErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class OperationSerializer(ContextSerializer):
    id = serializers.UUIDField()
    url = serializers.SerializerMethodField()
    kind = serializers.ChoiceField(choices=OperationKind.choices)
    application = serializers.CharField(source="application.name")
    job = serializers.CharField(source="job.name", allow_null=True, default=None)
    state = serializers.ChoiceField(choices=OperationState.choices)
    params = serializers.DictField()
    reason = serializers.CharField()
    requested_by = serializers.CharField(
        source="requested_by.username", allow_null=True, default=None
    )
    requested_via = serializers.CharField()
    phases = PhaseSerializer(many=True)
    current_phase = serializers.CharField()
    progress = serializers.FloatField()
    result = serializers.DictField()
    error = serializers.SerializerMethodField()
    cancel_requested = serializers.BooleanField()
    attempts = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    duration_s = serializers.FloatField(allow_null=True)

    def get_url(self, obj: Any) -> str:
        return absolute(self.request, "operation-detail", obj.pk)

    @extend_schema_field(OperationErrorSerializer(allow_null=True))
    def get_error(self, obj: Any) -> dict[str, str] | None:
        if not obj.error_code and not obj.error_message:
            return None
        return {"code": obj.error_code, "message": obj.error_message}


class OperationRequestSerializer(StrictSerializer):
    kind = serializers.ChoiceField(
        choices=OperationKind.choices,
        help_text="; ".join(f"`{k}`: {SPECS[k].summary}" for k in sorted(SPECS)),
        error_messages={
            "invalid_choice": '"{input}" is not an operation kind; the kinds are '
            + ", ".join(OperationKind.values)
        },
    )
    params = serializers.DictField(
        required=False, default=dict, help_text="The kind's parameters; see docs/api.md."
    )
    reason = serializers.CharField(required=False, default="", allow_blank=True, max_length=2000)


def sink_lag(head: Any) -> dict[str, float] | None:
    """The job's sink lag at its head commit: epochs of the branch its sinks' destinations
    lacked, and seconds since the oldest of them was committed (None: no such sink)."""
    stats = getattr(head, "stats", None) or {}
    epochs, seconds = stats.get("sink_lag_epochs"), stats.get("sink_lag_s")
    if not isinstance(epochs, int | float):
        return None
    return {"epochs": int(epochs), "seconds": float(seconds or 0.0)}


def head_event_time(head: Any) -> dict[str, Any]:
    """`watermark_ms`, `watermark_lag_s` and `late_records` of the job's head commit (all
    None when it records no event time)."""
    if head is None:
        return dict(NO_EVENT_TIME)
    return event_time_fields(head.stats, head.created_at)


class JobDetailSerializer(EventTimeFields, JobSerializer):
    """A job with its newest run, its active operation and its branch head (from the index);
    the view passes those three in the context."""

    current_run = serializers.SerializerMethodField()
    active_operation = serializers.SerializerMethodField()
    head = serializers.SerializerMethodField()
    sink_lag = serializers.SerializerMethodField(
        help_text="Epochs (and seconds) of the branch the job's sinks had not written at its "
        "head commit; null: the job has no sink that catches up."
    )

    @extend_schema_field(
        inline_serializer(
            "SinkLag",
            {"epochs": serializers.IntegerField(), "seconds": serializers.FloatField()},
            allow_null=True,
        )
    )
    def get_sink_lag(self, obj: Any) -> Any:
        return sink_lag(self.context.get("head"))

    def event_time(self, obj: Any) -> dict[str, Any]:
        return head_event_time(self.context.get("head"))

    @extend_schema_field(RunSerializer(allow_null=True))
    def get_current_run(self, obj: Any) -> Any:
        run = self.context.get("current_run")
        return None if run is None else RunSerializer(run).data

    @extend_schema_field(OperationSerializer(allow_null=True))
    def get_active_operation(self, obj: Any) -> Any:
        op = self.context.get("active_operation")
        return None if op is None else OperationSerializer(op, context=self.context).data

    @extend_schema_field(SnapshotSummarySerializer(allow_null=True))
    def get_head(self, obj: Any) -> Any:
        head = self.context.get("head")
        if head is None:
            return None
        prefix = snapshot_url_prefix(self.request, self.context["application"])
        return snapshot_summaries([head], prefix)[0]


def job_detail_representation(job: Any, context: Mapping[str, Any]) -> dict[str, Any]:
    """What `JobDetailSerializer` renders, built directly (the job read is the API's most
    frequent; DRF's per-field machinery was a third of its time). The context is the
    serializer's; `tests/api/test_job_detail_representation.py` holds the two equal."""
    run = context.get("current_run")
    operation = context.get("active_operation")
    head = context.get("head")
    request = context.get("request")
    shown = context["shown"]
    return {
        "name": str(job.name),
        "url": absolute(request, "job-detail", job.name),
        "application": str(job.application.name),
        "version": int(job.version.number),
        "branch": str(job.branch),
        "parallelism": int(job.parallelism),
        "runner": str(job.effective_runner),
        "state": str(job.state),
        "desired_state": str(job.desired_state),
        "status_reason": str(job.status_reason),
        "observed_state": shown.state,
        "observed_reason": shown.reason,
        "restarts": int(job.restarts),
        "created_at": _iso(job.created_at),
        "updated_at": _iso(job.updated_at),
        **head_event_time(head),
        "current_run": None
        if run is None
        else {
            "run_id": str(run.run_id),
            "runner": str(run.runner),
            "parallelism": int(run.parallelism),
            "phase": str(run.phase),
            "reason": str(run.reason),
            "operation": None if run.operation_id is None else str(run.operation_id),
            "created_at": _iso(run.created_at),
            "started_at": None if run.started_at is None else _iso(run.started_at),
            "finished_at": None if run.finished_at is None else _iso(run.finished_at),
        },
        "active_operation": None
        if operation is None
        else OperationSerializer(operation, context=context).data,
        "head": None
        if head is None
        else snapshot_summaries([head], snapshot_url_prefix(request, context["application"]))[0],
        "sink_lag": sink_lag(head),
    }


# -- audit and users ---------------------------------------------------------------------------


class AuditEntrySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    kind = serializers.CharField()
    actor = serializers.CharField(source="actor_name")
    action = serializers.CharField()
    target = serializers.CharField()
    outcome = serializers.CharField()
    status_code = serializers.IntegerField(allow_null=True)
    operation = serializers.UUIDField(source="operation_id", allow_null=True)
    source = serializers.CharField()
    detail = serializers.DictField()


class UserSerializer(ContextSerializer):
    username = serializers.CharField()
    url = serializers.SerializerMethodField()
    email = serializers.CharField()
    role = serializers.SerializerMethodField()
    is_active = serializers.BooleanField()
    date_joined = serializers.DateTimeField()
    last_login = serializers.DateTimeField(allow_null=True)

    def get_url(self, obj: Any) -> str:
        return absolute(self.request, "user-detail", obj.username)

    @extend_schema_field(
        {"type": "string", "enum": list(ROLES), "nullable": True}  # type: ignore[dict-item]
    )
    def get_role(self, obj: Any) -> str | None:
        return user_role(obj)


class UserCreateSerializer(StrictSerializer):
    username = WholeRegexField(r"^[\w.@+-]{1,150}$")
    role = serializers.ChoiceField(choices=list(ROLES))
    email = serializers.EmailField(required=False, default="")
    password = serializers.CharField(
        required=False,
        write_only=True,
        min_length=8,
        max_length=128,
        help_text="Omit for a token-only user. Checked by the password validators (too common, "
        "all digits, like the username: 422 `weak_password`).",
    )


class UserUpdateSerializer(StrictSerializer):
    role = serializers.ChoiceField(choices=list(ROLES), required=False)
    is_active = serializers.BooleanField(required=False)


class TokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    user = serializers.CharField(source="user.username")
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="The secret's first characters, to recognise it.")
    state = serializers.ChoiceField(choices=list(TOKEN_STATES))
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    last_used_at = serializers.DateTimeField(
        allow_null=True, help_text="Updated at most once a minute."
    )
    revoked_at = serializers.DateTimeField(allow_null=True)


class IssuedTokenSerializer(TokenSerializer):
    token = serializers.CharField(
        help_text="The secret: send it as `Authorization: Token <token>`. Shown only here."
    )


class TokenCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
    expires_in_days = serializers.IntegerField(
        min_value=1,
        max_value=3650,
        required=False,
        allow_null=True,
        default=None,
        help_text="Days until the token stops working; null or absent: it does not expire.",
    )
    user = WholeRegexField(
        r"^[\w.@+-]{1,150}$", required=False, help_text="Admins: issue it to another user."
    )


ANY_JSON = OpenApiTypes.OBJECT
