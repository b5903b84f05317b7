"""Forms of the dashboard's actions. Each turns into the `params` of one operation kind, which
the kind's own `clean` validates (as for the REST API); these forms only parse."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django import forms

from controlplane.applications.stores import store_list
from controlplane.jobs.spark_conf import OPERATOR_SPARK_CONF
from controlplane.operations.kinds.migrate import MODES as MIGRATE_MODES
from controlplane.operations.kinds.rescale import MODES as RESCALE_MODES
from controlplane.operations.models import IDEMPOTENCY_KEY_MAX
from runners import entry_points

MIGRATE_WORDS = {
    "copy": "move the lineage to another store and continue there",
    "rehash": "change the max parallelism M (a migration commit)",
    "transform": "apply a state migration function (a migration commit)",
}


class ActionForm(forms.Form):
    reason = forms.CharField(
        required=False,
        max_length=1000,
        widget=forms.TextInput(attrs={"placeholder": "why (kept in the audit log)"}),
    )
    idempotency_key = forms.CharField(
        widget=forms.HiddenInput, max_length=IDEMPOTENCY_KEY_MAX, required=False
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order_fields([name for name in self.fields if name != "reason"] + ["reason"])
        if not self.is_bound:
            # a repeated submission of the same rendered form asks for the same operation
            self.initial.setdefault("idempotency_key", f"web-{uuid.uuid4()}")

    def params(self) -> dict[str, Any]:
        return {}

    def field_for(self, name: str) -> str | None:
        """The form field a refusal's field (`spark_conf.spark.executor.memory`) is about."""
        return name if name in self.fields else None


def spark_field(key: str) -> str:
    """The form field of an operator's Spark setting: `spark.executor.memory` ->
    `spark_executor_memory`."""
    return key.replace(".", "_")


class StartForm(ActionForm):
    from_empty = forms.BooleanField(
        required=False,
        label="Create an empty initial snapshot when the branch has no commits",
    )

    def params(self) -> dict[str, Any]:
        return {"from_empty": True} if self.cleaned_data["from_empty"] else {}


class StopForm(ActionForm):
    pass


class RescaleForm(ActionForm):
    parallelism = forms.IntegerField(min_value=1, max_value=32768)
    mode = forms.ChoiceField(
        choices=[(m, m) for m in RESCALE_MODES],
        initial="auto",
        help_text="live: at the next epoch boundary, no restart; restart: stop, commit, relaunch;"
        " auto: live when the running job has the cores",
    )

    def params(self) -> dict[str, Any]:
        return {"parallelism": self.cleaned_data["parallelism"], "mode": self.cleaned_data["mode"]}


class RollbackForm(ActionForm):
    to = forms.CharField(max_length=300, label="Roll back to snapshot")

    def params(self) -> dict[str, Any]:
        return {"to": self.cleaned_data["to"].strip()}


class SavepointForm(ActionForm):
    name = forms.CharField(
        required=False, max_length=200, help_text="tag name; empty: savepoint-<branch>-e<epoch>"
    )
    snapshot = forms.CharField(required=False, max_length=300, help_text="empty: the branch head")
    force_epoch = forms.BooleanField(
        required=False, label="Wait for the next epoch and tag that one"
    )

    def params(self) -> dict[str, Any]:
        data = self.cleaned_data
        params: dict[str, Any] = {"force_epoch": data["force_epoch"]}
        if data["name"].strip():
            params["name"] = data["name"].strip()
        if data["snapshot"].strip():
            params["snapshot"] = data["snapshot"].strip()
        return params


class ForkForm(ActionForm):
    snapshot = forms.CharField(max_length=300, label="From snapshot")
    branch = forms.CharField(max_length=200, label="New branch")
    job_name = forms.CharField(
        required=False, max_length=100, help_text="empty: <application>-<branch>"
    )
    version = forms.TypedChoiceField(
        required=False,
        coerce=int,
        empty_value=None,
        help_text="an existing version (its job is an installed entry point); empty: the "
        "source job's version, else the latest",
    )
    parallelism = forms.IntegerField(
        required=False, min_value=1, max_value=32768, help_text="empty: the snapshot's"
    )
    start = forms.BooleanField(required=False, label="Start the new job right away")
    own_sinks = forms.BooleanField(
        required=False,
        label="Write to the sinks checked below instead of the version's",
        help_text="two branches never write one sink: a fork of a job with sinks writes to "
        "registered sinks nobody writes, or (none checked) to no sink",
    )
    sinks = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Sinks of the fork"
    )

    def __init__(
        self, *args: Any, versions: Iterable[Any] = (), sinks: Iterable[str] = (), **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["sinks"].choices = [(name, name) for name in sinks]  # type: ignore[attr-defined]
        # The Spark resource settings an operator may choose (the REST API's spark_conf): the
        # server checks them, as for the API, and a refusal names the key on its field.
        for key, bound in OPERATOR_SPARK_CONF.items():
            self.fields[spark_field(key)] = forms.CharField(
                required=False,
                max_length=20,
                label=key,
                help_text=f"empty: the version's; {bound.describe()}",
            )
        self.order_fields([name for name in self.fields if name != "reason"] + ["reason"])
        self.fields["version"].choices = [("", "—")] + [  # type: ignore[attr-defined]
            (
                v.number,
                f"v{v.number} · job {v.job}" + (f" · {v.code_version}" if v.code_version else ""),
            )
            for v in versions
        ]

    def params(self) -> dict[str, Any]:
        data = self.cleaned_data
        params: dict[str, Any] = {
            "snapshot": data["snapshot"].strip(),
            "branch": data["branch"].strip(),
            "start": data["start"],
        }
        if data["job_name"].strip():
            params["job_name"] = data["job_name"].strip()
        if data["version"] is not None:
            params["version"] = data["version"]
        if data["parallelism"] is not None:
            params["parallelism"] = data["parallelism"]
        spark_conf = {
            key: data[spark_field(key)].strip()
            for key in OPERATOR_SPARK_CONF
            if data.get(spark_field(key), "").strip()
        }
        if spark_conf:
            params["spark_conf"] = spark_conf
        if data.get("own_sinks"):
            params["sinks"] = list(data.get("sinks") or [])
        return params

    def field_for(self, name: str) -> str | None:
        if name.startswith("spark_conf."):
            field = spark_field(name.removeprefix("spark_conf."))
            return field if field in self.fields else None
        return super().field_for(name)


class MigrateForm(ActionForm):
    mode = forms.ChoiceField(
        choices=[(m, f"{m} — {MIGRATE_WORDS.get(m, m)}") for m in MIGRATE_MODES]
    )
    store = forms.ChoiceField(required=False, help_text="for copy: a store an admin registered")
    max_parallelism = forms.IntegerField(
        required=False, min_value=1, max_value=32768, help_text="for rehash"
    )
    function = forms.ChoiceField(
        required=False,
        help_text="for transform: a state migration an installed package registers",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["store"].choices = [("", "—")] + [  # type: ignore[attr-defined]
            (s.name, f"{s.name} ({s.shown_url})") for s in store_list()
        ]
        self.fields["function"].choices = [("", "—")] + [  # type: ignore[attr-defined]
            (m.name, f"{m.name} ({m.distribution})")
            for m in entry_points.registered(entry_points.STATE_MIGRATIONS)
        ]

    def params(self) -> dict[str, Any]:
        data = self.cleaned_data
        params: dict[str, Any] = {"mode": data["mode"]}
        if data["store"]:
            params["store"] = data["store"]
        if data["max_parallelism"] is not None:
            params["max_parallelism"] = data["max_parallelism"]
        if data["function"].strip():
            params["function"] = data["function"].strip()
        return params


class SavepointScheduleForm(forms.Form):
    """A job's periodic savepoints (not an operation: a setting the reconciler carries out);
    `job_set_savepoint_schedule` checks the bounds, as for the REST API and the CLI."""

    interval_s = forms.IntegerField(
        min_value=0, label="every (seconds, 0: off)", widget=forms.NumberInput(attrs={"min": 0})
    )
    retention = forms.IntegerField(
        min_value=0, label="keep the newest (0: all)", widget=forms.NumberInput(attrs={"min": 0})
    )
