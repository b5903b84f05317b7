"""The admin shows the index for inspection and offers no way to edit it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from controlplane.applications.models import Application
from controlplane.lineage.models import Snapshot
from controlplane.lineage.services import snapshot_index

from .lineages import Step, build

MODELS = ["snapshot", "branch", "tag", "reflogentry", "chain", "chainedge"]


@pytest.fixture
def admin_client_with_index(application: Application) -> Client:
    lineage = build([Step("commit", 0, 0), Step("fork", 0, 0), Step("merge", 0, 1)])
    for sid in lineage.order:
        snapshot_index(application=application, snapshot_id=sid, manifest=lineage.manifests[sid])
    user = User.objects.create_superuser("admin", "admin@example.com", "pw-123456")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("model", MODELS)
def test_admin_lists_index_rows(admin_client_with_index: Client, model: str) -> None:
    response = admin_client_with_index.get(reverse(f"admin:lineage_{model}_changelist"))
    assert response.status_code == 200
    assert reverse(f"admin:lineage_{model}_add") not in response.content.decode()


def test_admin_snapshot_page_is_read_only(admin_client_with_index: Client) -> None:
    snapshot = Snapshot.objects.filter(parent_count=2).get()
    url = reverse("admin:lineage_snapshot_change", args=[snapshot.pk])
    response = admin_client_with_index.get(url)
    assert response.status_code == 200
    assert snapshot.snapshot_id in response.content.decode()
    assert admin_client_with_index.post(url, {"branch": "x"}).status_code == 403
