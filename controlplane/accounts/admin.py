"""API tokens in the admin: issue (the secret is shown once, in the confirmation message),
revoke and rotate; every change is audited. Digests are never shown."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.accounts import tokens
from controlplane.accounts.models import ApiToken


class IssueTokenForm(forms.ModelForm):
    expires_in_days = forms.IntegerField(
        min_value=1,
        max_value=tokens.MAX_EXPIRY_DAYS,
        required=False,
        help_text="Empty: the token does not expire.",
    )

    class Meta:
        model = ApiToken
        fields = ["user", "name"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "state", "created_at", "expires_at", "last_used_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "user__username", "name"]
    readonly_fields = [
        "user",
        "name",
        "prefix",
        "state",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
        "rotated_from",
    ]
    exclude = ["digest"]
    actions = ["revoke", "rotate"]

    def get_form(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = IssueTokenForm
        return super().get_form(request, obj, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else []

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["user", "name", "expires_in_days"]
        return self.readonly_fields

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: the record stays for the audit trail

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if change:
            return
        issued = tokens.token_create(
            user=form.cleaned_data["user"],
            name=form.cleaned_data.get("name") or "",
            expires_in_days=form.cleaned_data.get("expires_in_days"),
            actor=request.user,
            source="admin",
        )
        obj.pk = issued.token.pk
        self._show_secret(request, issued)

    def _show_secret(self, request: HttpRequest, issued: tokens.Issued) -> None:
        self.message_user(
            request,
            f"Token {issued.token.prefix}… for {issued.token.user}: {issued.secret} — copy it "
            "now, it is not shown again.",
            messages.WARNING,
        )

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset.filter(revoked_at__isnull=True):
            tokens.token_revoke(token=token, actor=request.user, source="admin")
            self.message_user(request, f"revoked {token.prefix}…")

    @admin.action(description="Rotate the selected tokens (revoke, issue successors)")
    def rotate(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset.filter(revoked_at__isnull=True):
            issued = tokens.token_rotate(token=token, actor=request.user, source="admin")
            self._show_secret(request, issued)
