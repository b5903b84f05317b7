"""The Delta Lake destination (delta-rs through `deltalake`).

Each epoch of the branch becomes one Delta commit: the epoch's output rows (with an ``_epoch``
column) as Parquet files, and in the same commit Delta's *application transaction* (``txn``:
app id = the branch identity, version = the epoch) — the mechanism Spark's streaming Delta sink
uses. A retry reads the table's transaction version for the app id and writes nothing when the
table holds the epoch already; the commit's metadata (``epochal.snapshot``) names the snapshot
that wrote it, so after a rollback the destination finds where it left the branch's chain.
Rewinding is a Delta DELETE of the epochs after the target, committed with the transaction's
version set back to the target (earlier table versions stay readable by time travel).

Config: ``path`` (a directory, or ``s3://bucket/prefix``; admins register the roots),
``partition_by`` (output columns), ``schema_evolution`` (``"none"``: a schema the table does
not have is refused; ``"merge"``: new columns are added), ``storage_options`` (delta-rs object
store options: ``AWS_ENDPOINT_URL``, ``AWS_REGION``, …) and ``credentials_env`` (the prefix of
``<PREFIX>_AWS_ACCESS_KEY_ID`` / ``<PREFIX>_AWS_SECRET_ACCESS_KEY`` read when the sink writes).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from runners import config
from runners.engine.crash import maybe_crash
from runners.engine.output import EPOCH
from runners.engine.sink_catchup import ChainSinkBase, SinkRefused, epoch_table
from runners.engine.sinks import EpochOutput, Held

WRITER = "epochal.writer"  # commit metadata: the branch identity that wrote the commit
#: the table's description names the branch identity that writes it (delta-rs refuses
#: table properties outside Delta's own)
OWNER_PREFIX = "written by Epochal branch "
SNAPSHOT = "epochal.snapshot"  # commit metadata: the snapshot whose epoch the commit shows
EPOCH_META = "epochal.epoch"
SCHEMA_MODES = ("none", "merge")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass
class DeltaSink(ChainSinkBase):
    """Writes each epoch of the branch to the Delta table at `path`, exactly once."""

    path: str
    partition_by: tuple[str, ...] = ()
    schema_evolution: str = "none"
    storage_options: Mapping[str, str] = field(default_factory=dict)
    credentials_env: str = ""
    name: str = "delta"

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> Self:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"sink {name!r}: {key}: {why}")

        known = {"path", "partition_by", "schema_evolution", "storage_options", "credentials_env"}
        unknown = sorted(set(config) - known)
        if unknown:
            raise bad(unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
        path = config.get("path")
        if not isinstance(path, str) or not path.strip():
            raise bad("path", "required: the table's directory or s3://bucket/prefix")
        if path.startswith("file://"):
            path = path[len("file://") :]
        if "://" in path and not path.startswith("s3://"):
            raise bad("path", f"{path!r}: a local directory or an s3:// URL")
        if "://" not in path and not os.path.isabs(path):
            raise bad("path", f"{path!r} is relative: an absolute directory")
        if "@" in path.partition("://")[2].partition("/")[0]:
            raise bad("path", "credentials never go in the path: use credentials_env")
        partition_by = config.get("partition_by", [])
        if isinstance(partition_by, str):
            partition_by = [partition_by]
        if not isinstance(partition_by, list) or not all(
            isinstance(c, str) and _COLUMN.fullmatch(c) for c in partition_by
        ):
            raise bad("partition_by", f"{partition_by!r}: a list of column names")
        mode = config.get("schema_evolution", "none")
        if mode not in SCHEMA_MODES:
            raise bad("schema_evolution", f"{mode!r}: one of {', '.join(SCHEMA_MODES)}")
        options = config.get("storage_options", {})
        if not isinstance(options, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in options.items()
        ):
            raise bad("storage_options", "an object of string values")
        if any("SECRET" in k.upper() or "PASSWORD" in k.upper() for k in options):
            raise bad("storage_options", "no secrets here: name them with credentials_env")
        env = config.get("credentials_env", "")
        if not isinstance(env, str) or (env and not _ENV.fullmatch(env)):
            raise bad("credentials_env", f"{env!r}: an environment variable prefix")
        return cls(
            path=path,
            partition_by=tuple(partition_by),
            schema_evolution=str(mode),
            storage_options=dict(options),
            credentials_env=env,
            name=name,
        )

    # -- access ----------------------------------------------------------------------------

    def destination(self) -> str:
        return self.path

    def _options(self) -> dict[str, str] | None:
        options = dict(self.storage_options)
        if self.credentials_env:
            for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
                value = config.secret(f"{self.credentials_env}_{var}")
                if value:
                    options[var] = value
        if self.path.startswith("s3://"):
            options.setdefault("AWS_ALLOW_HTTP", "true")
            options.setdefault("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
        return options or None

    def _table(self) -> Any:
        """The table, or None when there is none yet at the path."""
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.path, storage_options=self._options()):
            return None
        return DeltaTable(self.path, storage_options=self._options())

    def _check_writer(self, table: Any, writer: str) -> None:
        description = table.metadata().description or ""
        owner = (
            description.removeprefix(OWNER_PREFIX) if description.startswith(OWNER_PREFIX) else ""
        )
        if owner != writer:
            raise SinkRefused(
                f"sink {self.name!r}: path: the Delta table at {self.path} is written by "
                f"{owner or 'another program'!s}, not by {writer}; two branches never write "
                "one table: a fork's version names a sink of its own"
            )

    # -- the chain sink --------------------------------------------------------------------

    def held(self, writer: str) -> Held | None:
        table = self._table()
        if table is None:
            return None
        self._check_writer(table, writer)
        epoch = table.transaction_version(writer)
        if not epoch:
            return None
        snapshot = self.snapshot_of(writer, int(epoch), table)
        return Held(int(epoch), snapshot or "")

    def snapshot_of(self, writer: str, epoch: int, table: Any = None) -> str | None:
        table = table if table is not None else self._table()
        if table is None:
            return None
        for limit in (64, None):  # the newest commits first: usually the one sought
            for commit in table.history(limit):  # newest first
                if commit.get(WRITER) == writer and str(commit.get(EPOCH_META)) == str(epoch):
                    snapshot = commit.get(SNAPSHOT)
                    return None if snapshot is None else str(snapshot)
        return None

    def _commit_properties(self, writer: str, epoch: int, snapshot: str | None) -> Any:
        from deltalake import CommitProperties, Transaction

        meta = {WRITER: writer, EPOCH_META: str(epoch), SNAPSHOT: snapshot or ""}
        return CommitProperties(custom_metadata=meta, app_transactions=[Transaction(writer, epoch)])

    def write(self, writer: str, output: EpochOutput) -> None:
        from deltalake import write_deltalake

        table = self._table()
        if table is not None:
            self._check_writer(table, writer)
            held = table.transaction_version(writer)
            if held is not None and held >= output.epoch:
                return  # shown already (a retry after the commit)
        data = epoch_table(output)
        missing = [c for c in self.partition_by if c not in data.column_names]
        if missing:
            raise SinkRefused(
                f"sink {self.name!r}: partition_by: the output has no column {missing[0]!r} "
                f"(columns: {', '.join(data.column_names)})"
            )
        if data.num_rows == 0:
            if table is None:
                return  # nothing to write and no schema yet: the next epoch with rows creates it
            data = table.to_pyarrow_dataset().schema.empty_table()  # a commit of no rows
        try:
            write_deltalake(
                self.path if table is None else table,
                data,
                mode="append",
                partition_by=list(self.partition_by) or None,
                schema_mode="merge" if self.schema_evolution == "merge" else None,
                description=f"{OWNER_PREFIX}{writer}" if table is None else None,
                storage_options=self._options() if table is None else None,
                commit_properties=self._commit_properties(writer, output.epoch, output.snapshot_id),
            )
        except Exception as exc:
            from deltalake.exceptions import SchemaMismatchError

            if isinstance(exc, SchemaMismatchError) or str(exc).startswith("Cast error"):
                raise SinkRefused(
                    f"sink {self.name!r}: schema_evolution: the Delta table at {self.path} "
                    f"refuses epoch {output.epoch}'s schema ({exc}); set schema_evolution to "
                    "merge to add new columns"
                ) from None
            raise
        maybe_crash(output.crash, "mid_sink_commit", output.epoch)

    def rewind(
        self, writer: str, epoch: int, snapshot_id: str | None, replay: Sequence[EpochOutput]
    ) -> None:
        table = self._table()
        if table is None:
            return
        self._check_writer(table, writer)
        table.delete(
            f"{EPOCH} > {int(epoch)}",
            commit_properties=self._commit_properties(writer, epoch, snapshot_id),
        )


__all__ = ["DeltaSink"]
