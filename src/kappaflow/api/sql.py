"""SQL over the lake: read-only DuckDB queries on the committed rows of the jobs' tables.

Each lake table a job writes is a view ``"<job>".<table>`` (a schema per job). A query
gets a DuckDB connection of its own, in memory: the views are made over pyarrow datasets
of exactly the files the tables' manifests list, then the connection is locked (no file,
network or extension access, no setting changed after), so the query sees the committed
rows and nothing else of the machine. Only one ``SELECT`` runs per request; it is
interrupted past ``api.sql_timeout_s`` and answers at most ``api.sql_max_rows`` rows.

- ``POST /v1/sql`` with ``{"sql": "SELECT ..."}``: ``columns`` (name, DuckDB type),
  ``rows`` (arrays, JSON values), ``row_count``, ``truncated``, ``elapsed_ms``. With
  ``"versions": {"<job>.<table>": N}`` a table is read as it was at version N (a Delta
  table's version; time travel).
- ``GET /v1/sql/tables``: each table's job, name, location, format, version, columns,
  files and rows.

A Delta table (what jobs write) is read at its latest committed version through delta-rs;
a manifest table of an earlier kappaflow through its manifests (lake_read).
"""

from __future__ import annotations

import base64
import math
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as time_of_day
from decimal import Decimal
from typing import Any
from uuid import UUID

import duckdb
from fastapi import FastAPI
from pydantic import BaseModel, Field

from kappaflow.errors import (
    SqlForbiddenError,
    SqlQueryFailedError,
    SqlSyntaxError,
    SqlTimeoutError,
    UnknownLakeTableError,
)
from kappaflow.jobs.manager import JobManager
from kappaflow.settings import Settings
from kappaflow.streams.output.lake_manifest import Manifest

#: Set on every query's connection once its views exist. ``enable_external_access``
#: closes files, the network, ``ATTACH``, ``COPY`` and ``INSTALL``; the two autoload
#: settings keep a query from pulling an extension in by naming one of its functions; the
#: lock comes last, so the query cannot set any of these back.
_LOCK_DOWN = (
    "SET TimeZone = 'UTC'",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    "SET enable_external_access = false",
    "SET lock_configuration = true",
)
_UNKNOWN_TABLE = re.compile(r"(Table|Schema|Catalog) with name .* does not exist")
_ERROR_KIND = re.compile(r"^[A-Za-z ]*Error: ")


@dataclass(frozen=True)
class LakeTable:
    """A lake table a job writes, as its plan names it."""

    job: str
    name: str
    location: str
    partition_by: tuple[str, ...]

    @property
    def qualified(self) -> str:
        """The name queries use: ``"<job>".<table>``, quoted as DuckDB quotes names."""
        return f"{_ident(self.job)}.{_ident(self.name)}"


@dataclass(frozen=True)
class SqlAnswer:
    columns: list[dict[str, str]]
    rows: list[list[Any]]
    truncated: bool
    elapsed_ms: float

    def as_json(self) -> dict[str, Any]:
        return {
            "columns": self.columns,
            "rows": self.rows,
            "row_count": len(self.rows),
            "truncated": self.truncated,
            "elapsed_ms": round(self.elapsed_ms, 1),
        }


def lake_tables(settings: Settings) -> list[LakeTable]:
    """Every lake table of every job, from the plans their drivers recorded."""
    jobs = JobManager(settings)
    found: dict[tuple[str, str], LakeTable] = {}
    for record in jobs.records():
        for output in jobs.plan(record.name)["outputs"]:
            for sink in output["sinks"]:
                if "parquet" in sink and sink.get("location"):
                    table = LakeTable(
                        record.name,
                        str(sink["parquet"]).rstrip("/").rsplit("/", 1)[-1],
                        str(sink["location"]),
                        tuple(sink.get("partition_by") or ()),
                    )
                    found.setdefault((table.job, table.name), table)
    return list(found.values())


def describe_tables(settings: Settings) -> list[dict[str, Any]]:
    """Each lake table: where it is, its columns (DuckDB types), its committed files and
    rows; a table without a committed batch yet has no columns."""
    described = []
    with lake_connection(settings) as (con, tables):
        for table, manifests in tables:
            columns: list[dict[str, str]] = []
            if manifests:
                columns = _columns(con.sql(f"SELECT * FROM {table.qualified}"))
            described.append(
                {
                    "table": f"{table.job}.{table.name}",
                    "job": table.job,
                    "name": table.name,
                    "location": table.location,
                    "format": _format(table.location),
                    "version": manifests[-1].batch_id if manifests else None,
                    "partition_by": list(table.partition_by),
                    "columns": columns,
                    "files": sum(len(m.files) for m in manifests),
                    "rows": sum(m.rows for m in manifests),
                }
            )
    return described


def _format(location: str) -> str:
    """``delta`` or ``manifest`` (a table of an earlier kappaflow)."""
    from kappaflow.streams.output.lake_read import is_delta_root

    return "delta" if is_delta_root(location) else "manifest"


def run_sql(
    settings: Settings,
    sql: str,
    *,
    timeout_s: float | None = None,
    max_rows: int | None = None,
    versions: dict[str, int] | None = None,
) -> SqlAnswer:
    """Run one read-only query over the lake tables' committed rows; ``versions``: tables
    (``"<job>.<table>"``) read at an earlier version."""
    timeout = settings.api.sql_timeout_s if timeout_s is None else timeout_s
    limit = settings.api.sql_max_rows if max_rows is None else max_rows
    started = time.monotonic()
    with lake_connection(settings, versions) as (con, _tables):
        _check_statement(con, sql)
        interrupted = threading.Event()

        def interrupt() -> None:
            interrupted.set()
            con.interrupt()

        timer = threading.Timer(timeout, interrupt)
        timer.daemon = True
        timer.start()
        try:
            rel = con.sql(sql)
            if rel is None:  # not a query; _check_statement lets none through
                raise SqlForbiddenError("only a query that returns rows runs here")
            columns = _columns(rel)
            rows = rel.limit(limit + 1).fetchall()
        except duckdb.InterruptException:
            if not interrupted.is_set():
                raise SqlQueryFailedError("the query was interrupted") from None
            raise SqlTimeoutError(
                f"the query ran past its limit of {timeout:g} s and was stopped (api.sql_timeout_s)"
            ) from None
        except duckdb.Error as error:
            raise _refusal(error) from None
        finally:
            timer.cancel()
    return SqlAnswer(
        columns=columns,
        rows=[[json_value(v) for v in row] for row in rows[:limit]],
        truncated=len(rows) > limit,
        elapsed_ms=(time.monotonic() - started) * 1000,
    )


def json_value(value: Any) -> Any:
    """A DuckDB value as JSON: times as ISO 8601 (a time without a zone taken as UTC),
    decimals as numbers, blobs as base64, NaN and infinities as null."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return json_value(int(value) if value == value.to_integral_value() else float(value))
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date | time_of_day):
        return value.isoformat()
    if isinstance(value, timedelta):
        seconds = abs(value.total_seconds())
        text = str(int(seconds)) if seconds.is_integer() else repr(seconds)
        return f"{'-' if value < timedelta(0) else ''}PT{text}S"
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return str(value)


class SqlRequest(BaseModel):
    sql: str = Field(description="one SELECT query over the lake tables")
    versions: dict[str, int] = Field(
        default_factory=dict,
        description='time travel: "<job>.<table>" read at that version (`kappaflow lake history`)',
    )


def add_sql_routes(app: FastAPI, settings: Settings) -> None:
    """``POST /v1/sql`` and ``GET /v1/sql/tables`` on the service's application."""

    @app.post("/v1/sql", summary="Run one read-only SQL query over the lake tables.")
    def sql(request: SqlRequest) -> dict[str, Any]:
        return run_sql(settings, request.sql, versions=request.versions).as_json()

    @app.get("/v1/sql/tables", summary="The lake tables SQL can query, with their columns.")
    def tables() -> dict[str, Any]:
        return {"items": describe_tables(settings)}


@contextmanager
def lake_connection(
    settings: Settings, versions: dict[str, int] | None = None
) -> Iterator[tuple[duckdb.DuckDBPyConnection, list[tuple[LakeTable, list[Manifest]]]]]:
    """A locked-down connection with a view per lake table; the tables and their
    manifests (empty for a table without a committed batch, which has no view).
    ``versions``: tables (``"<job>.<table>"``) read at an earlier version."""
    from kappaflow.streams.output.lake_read import committed_dataset, committed_manifests

    con = duckdb.connect(":memory:")
    try:
        tables = []
        found = lake_tables(settings)
        wanted = dict(versions or {})
        unknown = sorted(set(wanted) - {f"{t.job}.{t.name}" for t in found})
        if unknown:
            raise UnknownLakeTableError(
                f"versions names no lake table {', '.join(unknown)}; the lake tables are "
                '"<job>.<table>" (`kappaflow sql --tables`)'
            )
        for i, table in enumerate(found):
            version = wanted.get(f"{table.job}.{table.name}")
            manifests = committed_manifests(None, table.location, version)
            tables.append((table, manifests))
            if not manifests:
                continue
            source = f"_lake_{i}"
            con.register(source, committed_dataset(table.location, manifests))
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {_ident(table.job)}")
            con.execute(f"CREATE VIEW {table.qualified} AS SELECT * FROM {_ident(source)}")
        for statement in _LOCK_DOWN:
            con.execute(statement)
        yield con, tables
    finally:
        con.close()


def _check_statement(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as error:
        raise _refusal(error) from None
    if len(statements) != 1:
        raise SqlSyntaxError(f"give exactly one SQL statement, not {len(statements)}")
    kind = statements[0].type
    if kind is not duckdb.StatementType.SELECT:
        raise SqlForbiddenError(
            f"only read queries run here (SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, "
            f"SUMMARIZE), not {kind.name}"
        )


def _refusal(error: duckdb.Error) -> Exception:
    """DuckDB's error as kappaflow's, in one line."""
    message = _ERROR_KIND.sub("", str(error).strip().splitlines()[0] if str(error) else "")
    if isinstance(error, duckdb.PermissionException):
        return SqlForbiddenError(f"a query reads the lake tables only: {message}")
    if isinstance(error, duckdb.CatalogException) and _UNKNOWN_TABLE.search(message):
        return UnknownLakeTableError(
            f'{message}; the lake tables are "<job>".<table> (`kappaflow sql --tables`)'
        )
    if isinstance(
        error,
        duckdb.ParserException
        | duckdb.BinderException
        | duckdb.CatalogException
        | duckdb.NotImplementedException,
    ):
        return SqlSyntaxError(message)
    return SqlQueryFailedError(f"the query failed: {message}")


def _columns(rel: duckdb.DuckDBPyRelation) -> list[dict[str, str]]:
    return [{"name": n, "type": str(t)} for n, t in zip(rel.columns, rel.types, strict=True)]


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
