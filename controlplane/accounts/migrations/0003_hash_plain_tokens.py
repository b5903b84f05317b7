"""Tokens issued before hashing (DRF's authtoken table, plain text) become hashed API tokens
with the same secret, so clients keep working; the plain copies are then deleted."""

import hashlib

from django.db import migrations


def hash_plain_tokens(apps, schema_editor):  # type: ignore[no-untyped-def]
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    api_token = apps.get_model("accounts", "ApiToken")
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id, created FROM authtoken_token")
        rows = cursor.fetchall()
    for key, user_id, created in rows:
        digest = hashlib.sha256(key.encode()).hexdigest()
        if not api_token.objects.filter(digest=digest).exists():
            api_token.objects.create(
                user_id=user_id,
                name="issued before hashing",
                prefix=key[:8],
                digest=digest,
                created_at=created,
            )
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [("accounts", "0002_api_token")]

    operations = [migrations.RunPython(hash_plain_tokens, migrations.RunPython.noop)]
