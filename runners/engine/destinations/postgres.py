"""The PostgreSQL destination (psycopg 3, COPY).

Each epoch of the branch is written in ONE PostgreSQL transaction: the rows (COPY, CSV) and the
epoch's high-water mark, a row of ``epochal_sink_epochs`` (destination table, writer = the
branch identity, epoch, snapshot id). A retry finds the mark and writes nothing; a crash before
the COMMIT leaves nothing. Modes:

- ``append``: every epoch's output rows, with an ``_epoch`` column;
- ``upsert``: one row per key (``key``, default the job's key columns, the table's primary
  key), the latest epoch's values win; ``_epoch`` says which epoch wrote the row.

Rewinding (a rollback) runs in one transaction too: the rows of the epochs after the target
and their marks are deleted; in upsert mode the keys they held get back their values as of
the target (re-applied from the chain's output in the store).

Config: ``url`` (``postgresql://user@host:port/dbname``, never a password), ``password_env``
(the environment variable holding the password, read when the sink connects), ``table``
(``name`` or ``schema.name``), ``mode`` (``append``/``upsert``), ``key`` (upsert's key
columns), ``create`` (create the table from the first epoch's schema; default true).
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.csv as pacsv

from runners import config
from runners.engine.crash import maybe_crash
from runners.engine.output import EPOCH
from runners.engine.sink_catchup import ChainSinkBase, SinkRefused, epoch_table
from runners.engine.sinks import EpochOutput, Held

MARKS = "epochal_sink_epochs"
MODES = ("append", "upsert")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
CONNECT_TIMEOUT_S = 5


def _pg_type(name: str, t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        return "integer" if t.bit_width <= 16 else "bigint"
    if pa.types.is_floating(t):
        return "double precision"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz else "timestamp"
    if pa.types.is_date(t):
        return "date"
    raise SinkRefused(f"column {name!r} of type {t} has no PostgreSQL column type here")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass
class PostgresSink(ChainSinkBase):
    """Writes each epoch of the branch to `table` at `url`, exactly once (see the module)."""

    url: str
    table: str
    mode: str = "append"
    key: tuple[str, ...] = ()
    password_env: str = ""
    create: bool = True
    name: str = "postgres"
    _conn: Any = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> Self:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"sink {name!r}: {key}: {why}")

        known = {"url", "password_env", "table", "mode", "key", "create"}
        unknown = sorted(set(config) - known)
        if unknown:
            raise bad(unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
        url = config.get("url")
        if not isinstance(url, str) or urlsplit(url).scheme not in ("postgresql", "postgres"):
            raise bad("url", f"{url!r}: postgresql://user@host:port/dbname")
        parts = urlsplit(url)
        if parts.password is not None:
            raise bad("url", "no password in the URL: name its variable with password_env")
        if not parts.hostname or not parts.path.strip("/"):
            raise bad("url", f"{url!r} names no host or database: postgresql://user@host/db")
        table = config.get("table")
        if (
            not isinstance(table, str)
            or not all(_NAME.fullmatch(p) for p in table.split("."))
            or table.count(".") > 1
        ):
            raise bad("table", f"{table!r}: name or schema.name (letters, digits, _)")
        mode = config.get("mode", "append")
        if mode not in MODES:
            raise bad("mode", f"{mode!r}: one of {', '.join(MODES)}")
        key = config.get("key", [])
        if isinstance(key, str):
            key = [key]
        if not isinstance(key, list) or not all(
            isinstance(k, str) and _NAME.fullmatch(k) for k in key
        ):
            raise bad("key", f"{key!r}: a list of column names")
        env = config.get("password_env", "")
        if not isinstance(env, str) or (env and not _ENV.fullmatch(env)):
            raise bad("password_env", f"{env!r}: an environment variable name")
        create = config.get("create", True)
        if not isinstance(create, bool):
            raise bad("create", f"{create!r}: true or false")
        return cls(
            url=url,
            table=table,
            mode=str(mode),
            key=tuple(key),
            password_env=env,
            create=create,
            name=name,
        )

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_conn"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._conn = None

    def destination(self) -> str:
        return self.table

    # -- connection ------------------------------------------------------------------------

    def _connect(self) -> Any:
        import psycopg

        if self._conn is not None and not self._conn.closed:
            return self._conn
        kwargs: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S}
        if self.password_env:
            password = config.secret(self.password_env)
            if password is None:
                raise SinkRefused(
                    f"sink {self.name!r}: password_env: {self.password_env} is not set in the "
                    "job's environment"
                )
            kwargs["password"] = password
        self._conn = psycopg.connect(self.url, **kwargs)
        with self._conn.transaction():
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {MARKS} (destination text NOT NULL, writer text "
                "NOT NULL, epoch bigint NOT NULL, snapshot_id text NOT NULL, committed_at "
                "timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (destination, epoch))"
            )
        return self._conn

    def _run(self, fn: Any) -> Any:
        """`fn(conn)` inside one transaction holding the destination's lock (one writer at a
        time); a broken connection is dropped (the next call connects again)."""
        import psycopg

        conn = self._connect()
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
                return fn(conn)
        except psycopg.OperationalError:
            conn.close()
            self._conn = None
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the chain sink --------------------------------------------------------------------

    def _held(self, conn: Any, writer: str) -> Held | None:
        row = conn.execute(
            f"SELECT epoch, snapshot_id, writer FROM {MARKS} WHERE destination = %s "
            "ORDER BY epoch DESC LIMIT 1",
            (self.table,),
        ).fetchone()
        if row is None:
            return None
        if row[2] != writer:
            raise SinkRefused(
                f"sink {self.name!r}: table: {self.table} is written by {row[2]}, not by "
                f"{writer}; two branches never write one table: a fork's version names a sink "
                "of its own"
            )
        return Held(int(row[0]), str(row[1]))

    def held(self, writer: str) -> Held | None:
        return self._run(lambda conn: self._held(conn, writer))  # type: ignore[no-any-return]

    def snapshot_of(self, writer: str, epoch: int) -> str | None:
        row = self._run(
            lambda conn: conn.execute(
                f"SELECT snapshot_id FROM {MARKS} WHERE destination = %s AND writer = %s "
                "AND epoch = %s",
                (self.table, writer, epoch),
            ).fetchone()
        )
        return None if row is None else str(row[0])

    def _columns(self, conn: Any) -> dict[str, str]:
        schema, _, name = self.table.rpartition(".")
        rows = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = "
            "%s AND table_schema = COALESCE(NULLIF(%s, ''), current_schema()) "
            "ORDER BY ordinal_position",
            (name, schema),
        ).fetchall()
        return {str(r[0]): str(r[1]) for r in rows}

    def _key(self, output: EpochOutput) -> tuple[str, ...]:
        key = self.key or output.key
        if not key:
            raise SinkRefused(f"sink {self.name!r}: key: upsert needs key columns")
        return tuple(key)

    def _ensure_table(self, conn: Any, data: pa.Table, key: tuple[str, ...]) -> list[str]:
        """The table's columns the epoch writes (the table created when configured);
        SinkRefused naming the table when it lacks one of the output's columns."""
        columns = self._columns(conn)
        if not columns:
            if not self.create:
                raise SinkRefused(
                    f"sink {self.name!r}: table: {self.table} does not exist (create is false)"
                )
            defs = [
                f"{_q(f.name)} {_pg_type(f.name, f.type)}" for f in data.schema if f.name != EPOCH
            ]
            defs.append(f"{_q(EPOCH)} bigint NOT NULL")
            if self.mode == "upsert":
                defs.append(f"PRIMARY KEY ({', '.join(_q(k) for k in key)})")
            conn.execute(f"CREATE TABLE {self.table} ({', '.join(defs)})")
            columns = self._columns(conn)
        missing = [c for c in data.column_names if c not in columns]
        if missing:
            raise SinkRefused(
                f"sink {self.name!r}: table: {self.table} has no column {missing[0]!r} for the "
                f"job's output (its columns: {', '.join(columns)}); add it, or name another table"
            )
        return list(data.column_names)

    def _copy(self, conn: Any, target: str, data: pa.Table) -> None:
        buffer = io.BytesIO()
        pacsv.write_csv(
            data, buffer, pacsv.WriteOptions(include_header=False, quoting_style="needed")
        )
        cols = ", ".join(_q(c) for c in data.column_names)
        with conn.cursor().copy(f"COPY {target} ({cols}) FROM STDIN (FORMAT csv)") as copy:
            copy.write(buffer.getbuffer())

    def _upsert(
        self, conn: Any, data: pa.Table, key: tuple[str, ...], only_keys: str | None = None
    ) -> None:
        conn.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS epochal_stage (LIKE {self.table}) ON COMMIT DROP"
        )
        conn.execute("TRUNCATE epochal_stage")
        conn.execute("ALTER TABLE epochal_stage ADD COLUMN IF NOT EXISTS _n bigserial")
        self._copy(conn, "epochal_stage", data)
        cols = ", ".join(_q(c) for c in data.column_names)
        keys = ", ".join(_q(k) for k in key)
        sets = ", ".join(f"{_q(c)} = EXCLUDED.{_q(c)}" for c in data.column_names if c not in key)
        where = "" if only_keys is None else f"WHERE ({keys}) IN (SELECT {keys} FROM {only_keys})"
        conn.execute(
            f"INSERT INTO {self.table} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM "
            f"epochal_stage {where} ORDER BY {keys}, _n DESC ON CONFLICT ({keys}) DO "
            + (f"UPDATE SET {sets}" if sets else "NOTHING")
        )

    def write(self, writer: str, output: EpochOutput) -> None:
        data = epoch_table(output)

        def write(conn: Any) -> None:
            held = self._held(conn, writer)
            if held is not None and held.epoch >= output.epoch:
                return  # written already (a retry after the COMMIT)
            if data.num_rows:
                key = self._key(output) if self.mode == "upsert" else ()
                self._ensure_table(conn, data, key)
                if self.mode == "upsert":
                    self._upsert(conn, data, key)
                else:
                    self._copy(conn, self.table, data)
            conn.execute(
                f"INSERT INTO {MARKS} (destination, writer, epoch, snapshot_id) "
                "VALUES (%s, %s, %s, %s)",
                (self.table, writer, output.epoch, output.snapshot_id or ""),
            )
            maybe_crash(output.crash, "in_sink_transaction", output.epoch)  # before COMMIT

        self._run(write)

    def rewind(
        self, writer: str, epoch: int, snapshot_id: str | None, replay: Sequence[EpochOutput]
    ) -> None:
        def rewind(conn: Any) -> None:
            self._held(conn, writer)  # refuses another writer's table
            conn.execute(
                f"DELETE FROM {MARKS} WHERE destination = %s AND epoch > %s", (self.table, epoch)
            )
            columns = self._columns(conn)
            if not columns:
                return
            if self.mode == "append":
                conn.execute(f"DELETE FROM {self.table} WHERE {_q(EPOCH)} > %s", (epoch,))
                return
            key = self.key or (replay[0].key if replay else ())
            keys = ", ".join(_q(k) for k in key)
            conn.execute(
                f"CREATE TEMP TABLE epochal_gone ON COMMIT DROP AS SELECT {keys} FROM "
                f"{self.table} WHERE {_q(EPOCH)} > %s",
                (epoch,),
            )
            conn.execute(f"DELETE FROM {self.table} WHERE {_q(EPOCH)} > %s", (epoch,))
            for output in replay:  # the keys' values as of the target, oldest epoch first
                data = epoch_table(output)
                if data.num_rows:
                    self._upsert(conn, data, tuple(key), only_keys="epochal_gone")

        self._run(rewind)


__all__ = ["MARKS", "PostgresSink"]
