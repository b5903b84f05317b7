"""What each operation of the REST API does, as its OpenAPI description (generated clients
and the API docs show it). Keyed by operationId (`ApiAutoSchema.get_operation_id`); an
operation missing here is described by its summary (`tests/api/test_openapi_clients.py`
checks that every operation's description is its own)."""

from __future__ import annotations

from typing import Final

DESCRIPTIONS: Final[dict[str, str]] = {
    "api_root_get": "Links to every collection of the API, its schema and its docs.",
    "application_list_get": "The applications, a page at a time, each with its maximum "
    "parallelism (key groups), store and newest version.",
    "application_list_post": "Register an application: its name, its maximum parallelism (the "
    "number of key groups, fixed for its life) and a registered store.",
    "application_detail_get": "One application: its settings, versions and branches.",
    "version_list_get": "The application's versions, newest first: each names an installed job "
    "(an entry point of group `epochal.jobs`) and its launcher settings.",
    "version_list_post": "Add a version of the application: an installed job by name, a code "
    "version and launcher settings. Jobs then run it by number (start, hot-swap, fork).",
    "version_detail_get": "One version of the application, by number.",
    "branch_list_get": "The application's branches in the lineage: each with its head snapshot "
    "and epoch.",
    "tag_list_get": "The application's tags (savepoints): each names a snapshot.",
    "snapshot_log_get": "The history of a branch, tag or snapshot, newest first, a page at a "
    "time; `first_parent` follows a branch's own line only.",
    "snapshot_detail_get": "One snapshot: its manifest (epoch, parents, parallelism, offsets, "
    "key groups' chunks, stats) and provenance.",
    "snapshot_diff_get": "What changed between two snapshots: key groups whose state differs, "
    "offsets moved, parallelism and settings.",
    "lineage_graph_get": "A page of the application's lineage graph (snapshots, parent edges "
    "and refs), newest first, for drawing it.",
    "state_get": "Queryable state: a key, a page of a key group or a key range, at a "
    "snapshot or at an epoch of a branch (waiting up to `timeout` for it), or as of a "
    "downstream job's epoch.",
    "mapping_get": "For a job reading other jobs' branch outputs: each of its epochs and the "
    "upstream epochs and snapshots it read.",
    "web_get": "The job web: every job, the edges where one reads another's branch output, "
    "alignment state and lag per edge, and the lag alarm.",
    "audit_list_get": "The audit log, newest first, filtered by actor, action prefix, "
    "operation or time.",
    "entry_point_list_get": "The jobs and state migrations installed as entry points on the "
    "control plane (what versions and migrate operations may name).",
    "store_list_get": "The registered snapshot stores: the only places an application or a "
    "migrate operation may name.",
    "job_list_get": "The jobs, a page at a time, optionally of one application: state, "
    "version, branch, parallelism and head epoch.",
    "job_list_post": "Create a job: an application's version running on a branch at a "
    "parallelism, with its runner and Spark settings. It starts with a start operation.",
    "job_detail_get": "One job: its state, version, branch, parallelism, current run, head "
    "epoch and active operation; `?watch=` waits for a change.",
    "job_run_list_get": "The job's runs (each start, restart or hot-swap made one), newest first.",
    "job_logs_get": "The last lines of a run's log (default: the current run).",
    "job_autoscaler_get": "The job's autoscaling policy and its newest decisions with their "
    "inputs (rates, busy time, backlog) and outcomes.",
    "job_autoscaler_patch": "Change the job's autoscaling policy: only the fields given; the "
    "bounds are checked against the application's maximum parallelism.",
    "job_savepoint_schedule_get": "The job's periodic savepoints: how often one is taken, how "
    "many are kept, and the savepoints kept now.",
    "job_savepoint_schedule_patch": "Change the job's periodic savepoints: the interval and the "
    "retention (only the fields given; out-of-bounds values are refused).",
    "job_operation_request_post": "Request an operation on the job (start, stop, savepoint, "
    "rescale, rollback, hot-swap, fork, migrate, align): its kind and parameters, checked "
    "before anything happens. Answers 202 with the operation; an `Idempotency-Key` makes a "
    "retry return the same one.",
    "application_operation_request_post": "Fork the application from any snapshot into a new "
    "branch (no job needed). Answers 202 with the operation.",
    "operation_list_get": "The operations, newest first, optionally of one job or "
    "application, with their state.",
    "operation_detail_get": "One operation: kind, parameters, state, steps, error and result; "
    "`?watch=` waits for a change.",
    "operation_cancel_post": "Cancel an operation: a pending one at once, a running one at its "
    "next cancellable point (committed data is never left half-changed).",
    "token_list_get": "The caller's API tokens (admins: another user's), without their secrets.",
    "token_list_post": "Issue an API token for the caller; its secret is in this answer only.",
    "token_detail_get": "One token: name, state, expiry and last use, without its secret.",
    "token_detail_delete": "Revoke a token: it stops working at once; its record stays for "
    "the audit.",
    "token_rotate_post": "Revoke a token and issue its successor with the same name and "
    "lifetime; the new secret is in this answer only.",
    "user_list_get": "The users and their roles (viewer, operator, admin).",
    "user_list_post": "Create a user with a role, and a password or none (token-only).",
    "user_detail_get": "One user and their role.",
    "user_detail_patch": "Change a user's role or deactivate them (their tokens stop working).",
}
