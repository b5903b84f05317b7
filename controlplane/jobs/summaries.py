"""Job summaries (`JobSummary`): maintained by the database in the writer's transaction.

One statement recomputes a job's summary row from the rows it summarises (the newest run,
the newest pending or running operation, the head of the job's branch); triggers run it for
the job a write touches: a job created or moved to another branch, a run created or deleted,
an operation created or changing state, a branch created, moved or deleted. Each of these is
rare next to reads (a commit moves one branch once; an operation step changes a state), and a
reader then joins one row by primary key. Lease renewals and progress updates do not touch
the summary (only `state` and `job_id` of an operation matter to it).

PostgreSQL: plpgsql functions, installed by migration jobs 0005. SQLite: the same statement
inlined into row triggers, installed after every migrate (like the change triggers: a table
rebuild fails while another table's trigger names it).
"""

from __future__ import annotations

from controlplane.operations.models import ACTIVE_STATES

_ACTIVE = ", ".join(f"'{state}'" for state in ACTIVE_STATES)


def _refresh_where(condition: str) -> str:
    """The statement that recomputes the summary rows matching `condition` (SQL)."""
    job = "jobs_jobsummary.job_id"
    return (
        "UPDATE jobs_jobsummary SET "
        f"latest_run_id = (SELECT r.id FROM jobs_run r WHERE r.job_id = {job} "
        "ORDER BY r.created_at DESC, r.id DESC LIMIT 1), "
        f"active_operation_id = (SELECT o.id FROM operations_operation o WHERE o.job_id = {job} "
        f"AND o.state IN ({_ACTIVE}) ORDER BY o.created_at DESC LIMIT 1), "
        "head_id = (SELECT b.head_id FROM jobs_job j JOIN lineage_branch b "
        f"ON b.application_id = j.application_id AND b.name = j.branch WHERE j.id = {job}) "
        f"WHERE {condition}"
    )


def _refresh(job: str) -> str:
    """Recompute the summary of job id `job` (an SQL expression)."""
    return _refresh_where(f"job_id = {job}")


_JOBS_OF_BRANCH = (
    "SELECT j.id FROM jobs_job j WHERE j.application_id = {ref}.application_id "
    "AND j.branch = {ref}.name"
)


def _for_branch(ref: str) -> str:
    return _refresh_where(f"job_id IN ({_JOBS_OF_BRANCH.format(ref=ref)})")


POSTGRESQL = f"""
CREATE OR REPLACE FUNCTION summary_refresh(jid bigint) RETURNS void AS $$
BEGIN
    {_refresh("jid")};
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION summary_job() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO jobs_jobsummary(job_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    END IF;
    PERFORM summary_refresh(NEW.id);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER summary_job_insert AFTER INSERT ON jobs_job
    FOR EACH ROW EXECUTE FUNCTION summary_job();
CREATE TRIGGER summary_job_update AFTER UPDATE ON jobs_job FOR EACH ROW
    WHEN (OLD.branch IS DISTINCT FROM NEW.branch
          OR OLD.application_id IS DISTINCT FROM NEW.application_id)
    EXECUTE FUNCTION summary_job();

CREATE OR REPLACE FUNCTION summary_owned() RETURNS trigger AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.job_id IS NOT NULL THEN
        PERFORM summary_refresh(OLD.job_id);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.job_id IS NOT NULL
            AND (TG_OP = 'INSERT' OR NEW.job_id IS DISTINCT FROM OLD.job_id
                 OR NEW.state IS DISTINCT FROM OLD.state) THEN
        PERFORM summary_refresh(NEW.job_id);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER summary_operation AFTER INSERT OR DELETE ON operations_operation
    FOR EACH ROW EXECUTE FUNCTION summary_owned();
CREATE TRIGGER summary_operation_step AFTER UPDATE ON operations_operation FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.job_id IS DISTINCT FROM NEW.job_id)
    EXECUTE FUNCTION summary_owned();

CREATE OR REPLACE FUNCTION summary_run() RETURNS trigger AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN PERFORM summary_refresh(OLD.job_id); END IF;
    IF TG_OP <> 'DELETE' THEN PERFORM summary_refresh(NEW.job_id); END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER summary_run AFTER INSERT OR DELETE ON jobs_run
    FOR EACH ROW EXECUTE FUNCTION summary_run();
CREATE TRIGGER summary_run_moved AFTER UPDATE ON jobs_run FOR EACH ROW
    WHEN (OLD.job_id IS DISTINCT FROM NEW.job_id OR OLD.created_at IS DISTINCT FROM NEW.created_at)
    EXECUTE FUNCTION summary_run();

CREATE OR REPLACE FUNCTION summary_branch() RETURNS trigger AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        {_for_branch("OLD")};
    END IF;
    IF TG_OP <> 'DELETE' THEN
        {_for_branch("NEW")};
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER summary_branch AFTER INSERT OR DELETE ON lineage_branch
    FOR EACH ROW EXECUTE FUNCTION summary_branch();
CREATE TRIGGER summary_branch_moved AFTER UPDATE ON lineage_branch FOR EACH ROW
    WHEN (OLD.head_id IS DISTINCT FROM NEW.head_id OR OLD.name IS DISTINCT FROM NEW.name
          OR OLD.application_id IS DISTINCT FROM NEW.application_id)
    EXECUTE FUNCTION summary_branch();
"""

POSTGRESQL_DROP = """
DROP TRIGGER IF EXISTS summary_job_insert ON jobs_job;
DROP TRIGGER IF EXISTS summary_job_update ON jobs_job;
DROP TRIGGER IF EXISTS summary_operation ON operations_operation;
DROP TRIGGER IF EXISTS summary_operation_step ON operations_operation;
DROP TRIGGER IF EXISTS summary_run ON jobs_run;
DROP TRIGGER IF EXISTS summary_run_moved ON jobs_run;
DROP TRIGGER IF EXISTS summary_branch ON lineage_branch;
DROP TRIGGER IF EXISTS summary_branch_moved ON lineage_branch;
DROP FUNCTION IF EXISTS summary_job(), summary_owned(), summary_run(), summary_branch(),
    summary_refresh(bigint);
"""

BACKFILL = (
    "INSERT INTO jobs_jobsummary(job_id) SELECT id FROM jobs_job j "
    "WHERE NOT EXISTS (SELECT 1 FROM jobs_jobsummary m WHERE m.job_id = j.id)"
)
REFRESH_ALL = _refresh_where("1 = 1")


def _sqlite(name: str, event: str, table: str, body: list[str], when: str = "") -> str:
    condition = f" WHEN {when}" if when else ""
    statements = " ".join(f"{b};" for b in body)
    return f"CREATE TRIGGER {name} AFTER {event} ON {table}{condition} BEGIN {statements} END"


SQLITE = [
    _sqlite(
        "summary_job_insert",
        "INSERT",
        "jobs_job",
        ["INSERT OR IGNORE INTO jobs_jobsummary(job_id) VALUES (NEW.id)", _refresh("NEW.id")],
    ),
    _sqlite(
        "summary_job_update",
        "UPDATE",
        "jobs_job",
        [_refresh("NEW.id")],
        when="OLD.branch IS NOT NEW.branch OR OLD.application_id IS NOT NEW.application_id",
    ),
    *(
        _sqlite(f"summary_{table}_insert", "INSERT", t, [_refresh("NEW.job_id")])
        for table, t in (("operation", "operations_operation"), ("run", "jobs_run"))
    ),
    *(
        _sqlite(f"summary_{table}_delete", "DELETE", t, [_refresh("OLD.job_id")])
        for table, t in (("operation", "operations_operation"), ("run", "jobs_run"))
    ),
    _sqlite(
        "summary_operation_step",
        "UPDATE",
        "operations_operation",
        [_refresh("OLD.job_id"), _refresh("NEW.job_id")],
        when="OLD.state IS NOT NEW.state OR OLD.job_id IS NOT NEW.job_id",
    ),
    _sqlite(
        "summary_run_moved",
        "UPDATE",
        "jobs_run",
        [_refresh("OLD.job_id"), _refresh("NEW.job_id")],
        when="OLD.job_id IS NOT NEW.job_id OR OLD.created_at IS NOT NEW.created_at",
    ),
    _sqlite("summary_branch_insert", "INSERT", "lineage_branch", [_for_branch("NEW")]),
    _sqlite("summary_branch_delete", "DELETE", "lineage_branch", [_for_branch("OLD")]),
    _sqlite(
        "summary_branch_moved",
        "UPDATE",
        "lineage_branch",
        [_for_branch("OLD"), _for_branch("NEW")],
        when="OLD.head_id IS NOT NEW.head_id OR OLD.name IS NOT NEW.name "
        "OR OLD.application_id IS NOT NEW.application_id",
    ),
]
SQLITE_NAMES = [statement.split()[2] for statement in SQLITE]
