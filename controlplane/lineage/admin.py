"""Admin pages for inspecting the lineage index. The index mirrors the store and is rebuilt
by `manage.py reindex`, so nothing here can be edited, added or deleted by hand."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from controlplane.lineage.models import (
    Branch,
    Chain,
    ChainEdge,
    ReflogEntry,
    Snapshot,
    SnapshotParent,
    Tag,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Everything visible, nothing writable: edit the store, then reindex."""

    show_full_result_count = False  # counting a million rows on every page is slow

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ParentInline(admin.TabularInline):
    model = SnapshotParent
    fk_name = "child"
    fields = ["position", "parent"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdmin):
    list_display = [
        "snapshot_id",
        "application",
        "branch",
        "epoch",
        "kind",
        "parallelism",
        "generation",
        "chain",
        "created_at",
    ]
    list_filter = ["application", "kind"]
    search_fields = ["=snapshot_id", "branch", "=operation_id"]
    list_select_related = ["application"]
    raw_id_fields = ["first_parent", "chain"]
    inlines = [ParentInline]


@admin.register(Branch)
class BranchAdmin(ReadOnlyAdmin):
    list_display = ["name", "application", "head", "reflog_seq"]
    list_filter = ["application"]
    search_fields = ["name"]
    list_select_related = ["application", "head"]
    raw_id_fields = ["head"]


@admin.register(Tag)
class TagAdmin(ReadOnlyAdmin):
    list_display = ["name", "application", "target", "reflog_seq"]
    list_filter = ["application"]
    search_fields = ["name"]
    list_select_related = ["application", "target"]
    raw_id_fields = ["target"]


@admin.register(ReflogEntry)
class ReflogEntryAdmin(ReadOnlyAdmin):
    list_display = ["ref", "seq", "application", "old_id", "new_id", "operation_id", "reason", "at"]
    list_filter = ["application"]
    search_fields = ["=ref", "=operation_id", "=new_id"]


@admin.register(Chain)
class ChainAdmin(ReadOnlyAdmin):
    list_display = ["id", "application", "root_generation", "tip_generation"]
    list_filter = ["application"]


@admin.register(ChainEdge)
class ChainEdgeAdmin(ReadOnlyAdmin):
    list_display = ["from_chain", "from_generation", "to_chain", "to_generation", "first_parent"]
    raw_id_fields = ["from_chain", "to_chain"]
