"""Admin: policies are editable (validated like the API), decisions are read-only records."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from controlplane.autoscaler.decision import Policy
from controlplane.autoscaler.models import AutoscaleDecision, AutoscalePolicy


class PolicyForm(forms.ModelForm):
    class Meta:
        model = AutoscalePolicy
        fields = ["job", *AutoscalePolicy.FIELDS]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if all(name in data for name in AutoscalePolicy.FIELDS):
            problems = Policy(**{n: data[n] for n in AutoscalePolicy.FIELDS}).problems()
            if problems:
                raise ValidationError({k: f"must be {v}" for k, v in problems.items()})
        return data


@admin.register(AutoscalePolicy)
class AutoscalePolicyAdmin(admin.ModelAdmin):
    form = PolicyForm
    list_display = ["job", "mode", "target_utilisation", "min_parallelism", "max_parallelism"]
    list_filter = ["mode"]


@admin.register(AutoscaleDecision)
class AutoscaleDecisionAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "job",
        "mode",
        "action",
        "epoch",
        "current_parallelism",
        "recommended_parallelism",
        "outcome",
    ]
    list_filter = ["action", "outcome", "mode"]
    readonly_fields = [f.name for f in AutoscaleDecision._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
