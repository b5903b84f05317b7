"""The triggers that record changes (installed by migration 0001), per database vendor.

PostgreSQL: row triggers on jobs, runs, operations (only when a field the API shows
changed, not on lease renewals), branches and tags; statement triggers with transition
tables on snapshots, so a bulk insert of a million snapshots records one change per
application, not a million. Each change also sends ``NOTIFY epochal_changes, '<key>'``
(delivered at commit; repeated keys in one transaction are sent once).
SQLite: the same changes with row triggers and no notification (watches poll there).
"""

from __future__ import annotations

from controlplane.changes.keys import CHANNEL

# Operation fields the API shows: a change to any other (lease, context) is not a change.
_OPERATION_FIELDS = (
    "state",
    "phases",
    "current_phase",
    "progress",
    "result",
    "error_code",
    "error_message",
    "cancel_requested",
    "attempts",
    "started_at",
    "finished_at",
    "params",
    "reason",
)


def _row(names: tuple[str, ...], side: str) -> str:
    return "(" + ", ".join(f"{side}.{n}" for n in names) + ")"


POSTGRESQL = f"""
CREATE OR REPLACE FUNCTION changes_note(k text) RETURNS void AS $$
BEGIN
    INSERT INTO changes_change(key) VALUES (k);
    PERFORM pg_notify('{CHANNEL}', k);
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION changes_job() RETURNS trigger AS $$
BEGIN
    PERFORM changes_note('job:' || NEW.id);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER changes_job AFTER INSERT OR UPDATE ON jobs_job
    FOR EACH ROW EXECUTE FUNCTION changes_job();

CREATE OR REPLACE FUNCTION changes_run() RETURNS trigger AS $$
BEGIN
    PERFORM changes_note('job:' || NEW.job_id);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER changes_run AFTER INSERT OR UPDATE ON jobs_run
    FOR EACH ROW EXECUTE FUNCTION changes_run();

CREATE OR REPLACE FUNCTION changes_operation() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND {_row(_OPERATION_FIELDS, "OLD")}
            IS NOT DISTINCT FROM {_row(_OPERATION_FIELDS, "NEW")} THEN
        RETURN NULL;
    END IF;
    PERFORM changes_note('operation:' || replace(NEW.id::text, '-', ''));
    IF NEW.job_id IS NOT NULL THEN
        PERFORM changes_note('job:' || NEW.job_id);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER changes_operation AFTER INSERT OR UPDATE ON operations_operation
    FOR EACH ROW EXECUTE FUNCTION changes_operation();

CREATE OR REPLACE FUNCTION changes_ref() RETURNS trigger AS $$
DECLARE
    ref record;
BEGIN
    IF TG_OP = 'DELETE' THEN ref := OLD; ELSE ref := NEW; END IF;
    PERFORM changes_note('lineage:' || ref.application_id);
    IF TG_TABLE_NAME = 'lineage_branch' THEN
        PERFORM changes_note('job:' || j.id) FROM jobs_job j
            WHERE j.application_id = ref.application_id AND j.branch = ref.name;
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER changes_branch AFTER INSERT OR UPDATE OR DELETE ON lineage_branch
    FOR EACH ROW EXECUTE FUNCTION changes_ref();
CREATE TRIGGER changes_tag AFTER INSERT OR UPDATE OR DELETE ON lineage_tag
    FOR EACH ROW EXECUTE FUNCTION changes_ref();

CREATE OR REPLACE FUNCTION changes_snapshots() RETURNS trigger AS $$
BEGIN
    PERFORM changes_note('lineage:' || a.application_id)
        FROM (SELECT DISTINCT application_id FROM rows) a;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER changes_snapshot_insert AFTER INSERT ON lineage_snapshot
    REFERENCING NEW TABLE AS rows FOR EACH STATEMENT EXECUTE FUNCTION changes_snapshots();
CREATE TRIGGER changes_snapshot_delete AFTER DELETE ON lineage_snapshot
    REFERENCING OLD TABLE AS rows FOR EACH STATEMENT EXECUTE FUNCTION changes_snapshots();
"""

POSTGRESQL_DROP = """
DROP TRIGGER IF EXISTS changes_job ON jobs_job;
DROP TRIGGER IF EXISTS changes_run ON jobs_run;
DROP TRIGGER IF EXISTS changes_operation ON operations_operation;
DROP TRIGGER IF EXISTS changes_branch ON lineage_branch;
DROP TRIGGER IF EXISTS changes_tag ON lineage_tag;
DROP TRIGGER IF EXISTS changes_snapshot_insert ON lineage_snapshot;
DROP TRIGGER IF EXISTS changes_snapshot_delete ON lineage_snapshot;
DROP FUNCTION IF EXISTS changes_job(), changes_run(), changes_operation(), changes_ref(),
    changes_snapshots(), changes_note(text);
"""


def _sqlite_trigger(name: str, event: str, table: str, *inserts: str, when: str = "") -> str:
    body = " ".join(f"INSERT INTO changes_change(key) {i};" for i in inserts)
    condition = f" WHEN {when}" if when else ""
    return f"CREATE TRIGGER {name} AFTER {event} ON {table}{condition} BEGIN {body} END"


_JOBS_ON_BRANCH = (
    "SELECT 'job:' || id FROM jobs_job WHERE application_id = NEW.application_id "
    "AND branch = NEW.name"
)
SQLITE = (
    [
        _sqlite_trigger(f"changes_job_{e}", e.upper(), "jobs_job", "VALUES ('job:' || NEW.id)")
        for e in ("insert", "update")
    ]
    + [
        _sqlite_trigger(f"changes_run_{e}", e.upper(), "jobs_run", "VALUES ('job:' || NEW.job_id)")
        for e in ("insert", "update")
    ]
    + [
        _sqlite_trigger(
            f"changes_operation_{e}",
            e.upper(),
            "operations_operation",
            "VALUES ('operation:' || NEW.id)",
            "SELECT 'job:' || NEW.job_id WHERE NEW.job_id IS NOT NULL",
            # like PostgreSQL's: a lease renewal or a context write is not a change
            when=(
                f"{_row(_OPERATION_FIELDS, 'OLD')} IS NOT {_row(_OPERATION_FIELDS, 'NEW')}"
                if e == "update"
                else ""
            ),
        )
        for e in ("insert", "update")
    ]
    + [
        _sqlite_trigger(
            f"changes_branch_{e}",
            e.upper(),
            "lineage_branch",
            "VALUES ('lineage:' || NEW.application_id)",
            _JOBS_ON_BRANCH,
        )
        for e in ("insert", "update")
    ]
    + [
        _sqlite_trigger(
            "changes_branch_delete",
            "DELETE",
            "lineage_branch",
            "VALUES ('lineage:' || OLD.application_id)",
        ),
    ]
    + [
        _sqlite_trigger(
            f"changes_{table}_{e}",
            e.upper(),
            f"lineage_{table}",
            f"VALUES ('lineage:' || {'OLD' if e == 'delete' else 'NEW'}.application_id)",
        )
        for table in ("tag", "snapshot")
        for e in ("insert", "update", "delete")
        if not (table == "snapshot" and e == "update")
    ]
)
SQLITE_NAMES = [statement.split()[2] for statement in SQLITE]


# -- credentials: what an API token's authentication depends on ---------------------------------
# `token:<id>` when a token is created, revoked, re-dated or deleted (not on its once-a-minute
# `last_used_at`); `user:<id>` when a user is (de)activated, made or unmade superuser, renamed,
# or gains or loses a group (a role). The API's token cache (controlplane/accounts/
# token_cache.py) compares these revisions on every request, so a refusal is immediate in every
# process. Installed by migration 0002 on PostgreSQL, after every migrate on SQLite.

_TOKEN_FIELDS = ("revoked_at", "expires_at", "digest", "user_id")
_USER_FIELDS = ("is_active", "is_superuser", "username")

POSTGRESQL_CREDENTIALS = f"""
CREATE OR REPLACE FUNCTION changes_token() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM changes_note('token:' || OLD.id);
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND {_row(_TOKEN_FIELDS, "OLD")}
            IS NOT DISTINCT FROM {_row(_TOKEN_FIELDS, "NEW")} THEN
        RETURN NULL;
    END IF;
    PERFORM changes_note('token:' || NEW.id);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER changes_token AFTER INSERT OR UPDATE OR DELETE ON accounts_apitoken
    FOR EACH ROW EXECUTE FUNCTION changes_token();

CREATE OR REPLACE FUNCTION changes_user() RETURNS trigger AS $$
BEGIN
    IF {_row(_USER_FIELDS, "OLD")} IS NOT DISTINCT FROM {_row(_USER_FIELDS, "NEW")} THEN
        RETURN NULL;
    END IF;
    PERFORM changes_note('user:' || NEW.id);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER changes_user AFTER UPDATE ON auth_user
    FOR EACH ROW EXECUTE FUNCTION changes_user();

CREATE OR REPLACE FUNCTION changes_user_groups() RETURNS trigger AS $$
DECLARE
    membership record;
BEGIN
    IF TG_OP = 'DELETE' THEN membership := OLD; ELSE membership := NEW; END IF;
    PERFORM changes_note('user:' || membership.user_id);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER changes_user_groups AFTER INSERT OR UPDATE OR DELETE ON auth_user_groups
    FOR EACH ROW EXECUTE FUNCTION changes_user_groups();
"""

POSTGRESQL_CREDENTIALS_DROP = """
DROP TRIGGER IF EXISTS changes_token ON accounts_apitoken;
DROP TRIGGER IF EXISTS changes_user ON auth_user;
DROP TRIGGER IF EXISTS changes_user_groups ON auth_user_groups;
DROP FUNCTION IF EXISTS changes_token(), changes_user(), changes_user_groups();
"""

SQLITE_CREDENTIALS = [
    _sqlite_trigger(
        "changes_token_insert", "INSERT", "accounts_apitoken", "VALUES ('token:' || NEW.id)"
    ),
    _sqlite_trigger(
        "changes_token_update",
        "UPDATE",
        "accounts_apitoken",
        "VALUES ('token:' || NEW.id)",
        when=f"{_row(_TOKEN_FIELDS, 'OLD')} IS NOT {_row(_TOKEN_FIELDS, 'NEW')}",
    ),
    _sqlite_trigger(
        "changes_token_delete", "DELETE", "accounts_apitoken", "VALUES ('token:' || OLD.id)"
    ),
    _sqlite_trigger(
        "changes_user_update",
        "UPDATE",
        "auth_user",
        "VALUES ('user:' || NEW.id)",
        when=f"{_row(_USER_FIELDS, 'OLD')} IS NOT {_row(_USER_FIELDS, 'NEW')}",
    ),
    *(
        _sqlite_trigger(
            f"changes_user_groups_{e}",
            e.upper(),
            "auth_user_groups",
            f"VALUES ('user:' || {'OLD' if e == 'delete' else 'NEW'}.user_id)",
        )
        for e in ("insert", "update", "delete")
    ),
]
SQLITE_CREDENTIALS_NAMES = [statement.split()[2] for statement in SQLITE_CREDENTIALS]
