"""Change records: what changed, in the order it was committed, kept by the database itself.

Triggers on jobs, runs, operations, branches, tags and snapshots insert one `Change` row per
changed thing (`job:<id>`, `operation:<hex>`, `lineage:<application id>`) and, on
PostgreSQL, `NOTIFY epochal_changes` with the key. The newest change id of a key is that
thing's *revision*: API responses carry it as their ETag, and watches (`?watch=`) wake up when
a notification names their key. Every writer is covered — ORM saves, `update()`, bulk
inserts, COPY — because the database, not the writer's code, records the change.
"""
