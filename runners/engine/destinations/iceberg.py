"""An exactly-once Apache Iceberg sink through `pyiceberg` and its SQL catalog.

Every epoch is one Iceberg *append* snapshot of the table, holding the epoch's output rows
with an ``_epoch`` column, whose summary names the writer and the epoch: ``epochal.identity``
(``<namespace>/<branch>``), ``epochal.epoch`` and ``epochal.snapshot`` (the store snapshot
that committed the epoch). The catalog is a SQL database (PostgreSQL, or SQLite for an
embedded setup): its compare-and-swap of the table's metadata location commits a snapshot.

- **prepare** (before the store's CAS) writes the epoch's Parquet data files under the table's
  location: no snapshot references them, so readers do not see them. The pending record lists
  them.
- **commit** (after the CAS) walks the table's snapshot ancestry back to the writer's latest
  snapshot: if it names this store snapshot, the epoch is there and nothing happens; otherwise
  one append adds the staged files (a new process reuses them when they are all still there,
  else writes them again from the store). A retry after a crash, or after the catalog was
  unreachable, finds the append or makes it: never two.
- **committed** is the writer's latest snapshot's epoch and store snapshot.
- **rollback_to(epoch)** removes the rows of the writer's epochs after `epoch` in one
  *overwrite* snapshot (the data files those epochs' snapshots added), whose summary names
  `epoch` again: the table then equals the branch's output up to `epoch`, and its history keeps
  the abandoned epochs for time travel.

A table is written by one branch: a commit refuses a table whose latest snapshot of the sink
names another writer.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

import pyarrow as pa

from runners.engine.crash import maybe_crash
from runners.engine.destinations.fields import FromConfig, check_password_env, with_password
from runners.engine.destinations.log_records import identity
from runners.engine.sinks import EpochOutput, Held

KIND = "iceberg"
IDENTITY, EPOCH, SNAPSHOT, ROLLBACK = (
    "epochal.identity", "epochal.epoch", "epochal.snapshot", "epochal.rollback",
)  # fmt: skip
EPOCH_COLUMN = "_epoch"
COMMIT_ATTEMPTS = 4
TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
log = logging.getLogger(__name__)


class IcebergSinkError(RuntimeError):
    """The catalog or the table refused the sink's commit."""


@dataclass
class IcebergSink(FromConfig):
    """Writes each epoch's output rows to the Iceberg table `table` (``namespace.name``) of
    the SQL catalog at `catalog_uri` (a SQLAlchemy URL: ``postgresql+psycopg://…`` or
    ``sqlite:////path/catalog.db``), data files under `warehouse` (a path or ``file://``/
    ``s3://`` URL). `create_table`: create the table (and namespace) from the first epoch's
    output schema when it does not exist."""

    KIND: ClassVar[str] = KIND
    REQUIRED: ClassVar[dict[str, type]] = {"catalog_uri": str, "warehouse": str, "table": str}
    OPTIONAL: ClassVar[dict[str, type]] = {
        "catalog_name": str, "create_table": bool, "password_env": str,
    }  # fmt: skip

    catalog_uri: str
    warehouse: str
    table: str
    catalog_name: str = "epochal"
    create_table: bool = True
    #: the environment variable holding the catalog database's password (never in the URI)
    password_env: str = ""
    name: str = KIND
    _staged: dict[tuple[str, str, int], list[Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _catalog: Any = field(default=None, init=False, repr=False, compare=False)
    #: the table as this process last committed it (the catalog's CAS refuses a stale one)
    _table: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.catalog_uri.startswith(("postgresql", "sqlite:")):
            raise ValueError(
                f"sink {self.name!r} ({KIND}): field 'catalog_uri' must be a SQLAlchemy URL "
                f"postgresql+psycopg://… or sqlite:///…, not {self.catalog_uri!r}"
            )
        scheme = urlsplit(self.warehouse).scheme
        if not (self.warehouse.startswith("/") or scheme in ("file", "s3", "s3a")):
            raise ValueError(
                f"sink {self.name!r} ({KIND}): field 'warehouse' must be an absolute path or a "
                f"file:// or s3:// URL, not {self.warehouse!r}"
            )
        check_password_env(KIND, self.name, self.password_env)
        if not TABLE.fullmatch(self.table):
            raise ValueError(
                f"sink {self.name!r} ({KIND}): field 'table' must be <namespace>.<name> "
                f"(letters, digits, '_'), not {self.table!r}"
            )

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_staged", "_catalog", "_table")}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _staged={}, _catalog=None, _table=None)

    def _describe(self) -> str:
        return f"sink {self.name!r}: Iceberg table {self.table!r}"

    # -- catalog and table -------------------------------------------------------------------

    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog

            uri = with_password(self.catalog_uri, self.password_env, KIND, self.name)
            if uri.startswith("postgresql") and "connect_timeout" not in uri:
                uri += ("&" if "?" in uri else "?") + "connect_timeout=5"
            warehouse = self.warehouse if "://" in self.warehouse else f"file://{self.warehouse}"
            try:
                self._catalog = SqlCatalog(self.catalog_name, uri=uri, warehouse=warehouse,
                                           pool_pre_ping="true")  # fmt: skip
            except Exception as exc:
                raise IcebergSinkError(
                    f"{self._describe()}: the catalog at {self.catalog_uri} is unreachable: {exc}"
                ) from None
        return self._catalog

    def load(self, schema: pa.Schema | None = None) -> Any:
        """The table (None when it does not exist and no `schema` to create it with)."""
        from pyiceberg.exceptions import NoSuchTableError

        catalog = self.catalog()
        try:
            return catalog.load_table(self.table)
        except NoSuchTableError:
            if schema is None:
                return None
            if not self.create_table:
                raise ValueError(
                    f"{self._describe()} does not exist in catalog {self.catalog_name!r} and "
                    "create_table is false: create it, or set create_table"
                ) from None
            catalog.create_namespace_if_not_exists(self.table.rpartition(".")[0])
            # no retries inside pyiceberg's commit: a conflict comes back here, and the
            # sink looks whether the epoch landed before it appends again
            return catalog.create_table_if_not_exists(
                self.table, schema=schema, properties={"commit.retry.num-retries": "0"}
            )
        except Exception as exc:
            self._catalog = None  # a new engine next time
            raise IcebergSinkError(
                f"{self._describe()}: the catalog at {self.catalog_uri} is unreachable: {exc}"
            ) from None

    def check(self) -> None:
        """ValueError unless the catalog answers and the table exists (or may be created):
        before a job starts."""
        try:
            table = self.load()
        except IcebergSinkError as exc:
            raise ValueError(f"{exc} (field 'catalog_uri')") from None
        if table is None and not self.create_table:
            raise ValueError(
                f"{self._describe()} does not exist in catalog {self.catalog_name!r} and "
                "create_table is false: create it, or set create_table"
            )

    def held(self, table: Any, writer: str) -> tuple[Held | None, Any]:
        """(epoch and store snapshot, Iceberg snapshot) of `writer`'s latest snapshot in the
        table's current ancestry; refuses a table another writer's latest snapshot names."""
        from pyiceberg.table.snapshots import ancestors_of

        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            summary = snapshot.summary
            if summary is None or summary.get(IDENTITY) is None:
                continue
            who = summary.get(IDENTITY)
            if who != writer:
                raise ValueError(
                    f"{self._describe()} is written by {who!r}, not {writer!r}: a table has "
                    "one writing branch; give this branch's version its own table"
                )
            epoch = int(summary.get(EPOCH, 0))
            held = Held(epoch, summary.get(SNAPSHOT, "")) if epoch > 0 else None
            return held, snapshot
        return None, None

    # -- data files --------------------------------------------------------------------------

    def _rows(self, output: EpochOutput) -> pa.Table | None:
        tables = [t for part in output.parts for t in output.tables(part)]
        if not tables:
            return None
        rows = pa.concat_tables(tables, promote_options="permissive")
        epochs = pa.array([output.epoch] * rows.num_rows, pa.int64())
        return rows.append_column(EPOCH_COLUMN, epochs)

    def _write(self, table: Any, rows: pa.Table) -> list[Any]:
        from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _dataframe_to_data_files

        try:
            _check_pyarrow_schema_compatible(table.schema(), rows.schema,
                                             format_version=table.format_version)  # fmt: skip
        except ValueError as exc:
            raise ValueError(
                f"{self._describe()} refuses the output's schema (field 'table'): {exc}; use a "
                "new table, or evolve this one's schema first"
            ) from None
        return list(_dataframe_to_data_files(table_metadata=table.metadata, df=rows,
                                             io=table.io, write_uuid=uuid.uuid4()))  # fmt: skip

    def _restage(self, table: Any, paths: Iterable[str], output: EpochOutput) -> list[Any]:
        """The data files of a pending record (written again from the store when any is gone)."""
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        paths = list(paths)
        if all(table.io.new_input(p).exists() for p in paths):
            return [parquet_file_to_data_file(table.io, table.metadata, p) for p in paths]
        rows = self._rows(output)
        return [] if rows is None else self._write(table, rows)

    # -- the Sink protocol -------------------------------------------------------------------

    def prepare(self, output: EpochOutput) -> dict[str, Any]:
        writer = identity(output.namespace, output.branch)
        rows = self._rows(output)
        record: dict[str, Any] = {"table": self.table, "identity": writer, "files": [],
                                  "records": 0 if rows is None else rows.num_rows}  # fmt: skip
        if rows is None:
            return record
        try:
            table = self._table or self.load(rows.schema)
        except IcebergSinkError as exc:  # down: the commit writes the files when it is back
            log.warning("%s; the epoch's files are written at its commit", exc)
            return record
        files = self._write(table, rows)
        self._staged[(output.namespace, output.branch, output.epoch)] = files
        record["files"] = [f.file_path for f in files]
        return record

    def commit(self, output: EpochOutput, pending: Mapping[str, Any]) -> None:
        from pyiceberg.exceptions import CommitFailedException

        if output.snapshot_id is None:
            raise ValueError("commit needs the snapshot that committed the epoch")
        writer = str(pending["identity"])
        staged = self._staged.pop((output.namespace, output.branch, output.epoch), None)
        for attempt in range(COMMIT_ATTEMPTS):
            rows = None if staged is not None or pending["files"] else self._rows(output)
            table = (self._table if attempt == 0 else None) or self.load(
                None if rows is None else rows.schema
            )
            if table is None:
                return  # no table and nothing to write: an empty epoch before the first rows
            held, _ = self.held(table, writer)
            if held is not None and held.snapshot_id == output.snapshot_id:
                return
            if held is not None and held.epoch >= output.epoch:
                # the branch was rolled back: the table holds epochs no longer on its chain;
                # take them out (one overwrite snapshot), then append this epoch after them
                # unless the table already holds it (the head a restart finishes)
                keep = output.epoch if self._holds(table, writer, output) else output.epoch - 1
                log.info(
                    "%s holds epoch %d of snapshot %s, not this branch's %s: rolling the table "
                    "back to epoch %d",
                    self._describe(), held.epoch, held.snapshot_id, output.snapshot_id, keep,
                )  # fmt: skip
                self.rollback_to(keep, namespace=output.namespace, branch=output.branch)
                if keep == output.epoch:
                    return
                table = self.load(None if rows is None else rows.schema)
                held, _ = self.held(table, writer) if table is not None else (None, None)
                if held is not None and held.epoch >= output.epoch:
                    raise IcebergSinkError(
                        f"{self._describe()} still holds epoch {held.epoch} after rolling back "
                        f"to epoch {output.epoch - 1}; inspect the table's snapshots"
                    )
            if staged is None:
                staged = self._restage(table, pending["files"], output) if rows is None else (
                    self._write(table, rows))  # fmt: skip
            maybe_crash(output.crash, "mid_sink_commit", output.epoch)
            summary = {IDENTITY: writer, EPOCH: str(output.epoch), SNAPSHOT: output.snapshot_id}
            try:
                self._table = self._append(table, staged, summary)
                return
            except CommitFailedException as exc:  # another commit came first: look again
                log.info("%s: commit of epoch %d retried: %s", self._describe(), output.epoch, exc)
                self._table = None
            except Exception as exc:
                self._catalog = self._table = None
                raise IcebergSinkError(
                    f"{self._describe()}: committing epoch {output.epoch} failed: {exc}; the "
                    "snapshot is committed and a retry finishes the epoch's publication"
                ) from None
        raise IcebergSinkError(
            f"{self._describe()}: {COMMIT_ATTEMPTS} concurrent commits came first; retry"
        )

    @staticmethod
    def _holds(table: Any, writer: str, output: EpochOutput) -> bool:
        """Whether the writer's newest snapshot at or before `output`'s epoch is that epoch
        from `output`'s store snapshot."""
        found, _ = _back_to(table, writer, output.epoch)
        return found is not None and (int(found.get(EPOCH, 0)), found.get(SNAPSHOT)) == (
            output.epoch, output.snapshot_id,
        )  # fmt: skip

    @staticmethod
    def _append(table: Any, files: list[Any], summary: dict[str, str]) -> Any:
        """One append snapshot of `files` with `summary`; the table after it."""
        txn = table.transaction()
        with txn.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)
        return txn.commit_transaction()

    def committed(self, pending: Mapping[str, Any]) -> Held | None:
        table = self.load()
        return None if table is None else self.held(table, str(pending["identity"]))[0]

    def rollback_to(self, epoch: int, *, namespace: str, branch: str) -> None:
        """Remove the rows of the epochs after `epoch` the branch `namespace/branch` wrote, in
        one overwrite snapshot naming `epoch` (and its store snapshot) again."""
        writer = identity(namespace, branch)
        table = self.load()
        if table is None:
            return
        self.held(table, writer)  # refuses another writer's table
        found, abandoned = _back_to(table, writer, epoch)
        target = "" if found is None else found.get(SNAPSHOT, "")
        if not abandoned:
            return
        files = [
            entry.data_file
            for manifest in table.current_snapshot().manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
            if entry.snapshot_id in abandoned
        ]
        marker = {IDENTITY: writer, EPOCH: str(epoch), SNAPSHOT: target, ROLLBACK: "true"}
        txn = table.transaction()
        if files:
            with txn.update_snapshot(snapshot_properties=marker).overwrite() as overwrite:
                for data_file in files:
                    overwrite.delete_data_file(data_file)
        else:
            txn.update_snapshot(snapshot_properties=marker).fast_append().commit()
        txn.commit_transaction()
        self._table = None

    def published(self) -> dict[int, list[dict[str, Any]]]:
        """The table's rows per epoch (``_epoch``), all of them (a check reads the table)."""
        table = self.load()
        epochs: dict[int, list[dict[str, Any]]] = {}
        for row in [] if table is None else table.scan().to_arrow().to_pylist():
            epochs.setdefault(int(row.pop(EPOCH_COLUMN)), []).append(row)
        return epochs

    def forget_staged(self) -> None:
        """Forget the data files staged in memory: a later commit reads them back from the
        pending record's paths (or writes them again from the store)."""
        self._staged.clear()

    def close(self) -> None:
        self._staged.clear()
        self._table = None
        if self._catalog is not None:
            self._catalog.engine.dispose()
            self._catalog = None


def _back_to(table: Any, writer: str, epoch: int) -> tuple[Any, set[int]]:
    """Walking the table's ancestry from its current snapshot: (the summary of the writer's
    newest snapshot at or before `epoch`, None when there is none; the ids of the writer's
    snapshots after it)."""
    from pyiceberg.table.snapshots import ancestors_of

    after: set[int] = set()
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        if summary is None or summary.get(IDENTITY) != writer:
            continue
        if int(summary.get(EPOCH, 0)) <= epoch:
            return summary, after
        after.add(snapshot.snapshot_id)
    return None, after


__all__ = ["IcebergSink", "IcebergSinkError"]
