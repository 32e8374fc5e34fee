"""``kappaflow lake``: the lake's Delta tables: their versions, compaction and migration.

A TABLE is a job's table as SQL names it (``JOB.TABLE``) or a table's path or URI.
``history`` reads the Delta log through delta-rs; ``optimize`` and ``migrate`` run a
local Spark session (Spark's tasks rewrite the files; Delta Kernel commits).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table
from kappaflow.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@click.group("lake")
def lake() -> None:
    """The lake's Delta tables: versions, compaction, migration of older tables."""


@lake.command("history")
@click.argument("name", metavar="TABLE")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines: one per version")
@pass_context
def history(ctx: Context, name: str, as_json: bool) -> None:
    """List TABLE's versions, newest first: what each commit did and when. Any of them can
    be read (`kappaflow sql --version JOB.TABLE=N`) until a vacuum removes its files."""
    from kappaflow.streams.output.lake_read import delta_history

    rows = delta_history(location(ctx.settings, name))
    if as_json:
        for row in rows:
            json_line(row)
        return
    table(
        None,
        ["version", "time", "operation", "batch"],
        [[r["version"], r["time"], r["operation"], _or_blank(r["batch"])] for r in rows],
    )


@lake.command("optimize")
@click.argument("name", metavar="TABLE")
@click.option(
    "--min-files",
    type=click.IntRange(min=2),
    default=2,
    show_default=True,
    help="compact a partition holding at least this many files",
)
@pass_context
def optimize(ctx: Context, name: str, min_files: int) -> None:
    """Compact TABLE: each partition's small files become one, in one Delta commit. The
    rows do not change; earlier versions still read their own files."""
    from kappaflow.streams.output.lake_delta import optimize as compact

    root = location(ctx.settings, name)
    with _spark(ctx.settings) as spark:
        done = compact(spark, root, min_files=min_files)
    if done.version is None:
        say(f"{name}: nothing to compact (no partition has {min_files} files)")
        return
    say(f"{name}: version {done.version} replaced {done.removed} files by {done.added}")


@lake.command("migrate")
@click.argument("name", metavar="TABLE")
@pass_context
def migrate(ctx: Context, name: str) -> None:
    """Make a lake table of an earlier kappaflow (manifests) a Delta table in place: one
    commit of its committed files. Its job's next batch does this by itself."""
    from kappaflow.streams.output.lake_delta import migrate as to_delta

    root = location(ctx.settings, name)
    with _spark(ctx.settings) as spark:
        version = to_delta(spark, root, _app_id(ctx.settings, name))
    if version is None:
        say(f"{name}: nothing to migrate (already a Delta table, or no committed batch)")
        return
    say(f"{name}: Delta table, version {version}")


def location(settings: Settings, name: str) -> str:
    """Where TABLE is: a path or URI as given, else a job's table by ``JOB.TABLE``."""
    if name.startswith(("/", "file:")) or "://" in name:
        return name
    from kappaflow.api.sql import lake_tables
    from kappaflow.errors import UnknownLakeTableError

    for found in lake_tables(settings):
        if f"{found.job}.{found.name}" == name:
            return found.location
    raise UnknownLakeTableError(
        f"no lake table {name!r}: give JOB.TABLE (`kappaflow sql --tables`) or a path"
    )


def _app_id(settings: Settings, name: str) -> str:
    """The application id a job's writer commits under (its job and output); a table given
    by path gets the default one."""
    from kappaflow.api.sql import lake_tables
    from kappaflow.jobs.manager import JobManager
    from kappaflow.streams.output.lake_delta import DEFAULT_APP_ID

    for found in lake_tables(settings):
        if f"{found.job}.{found.name}" == name:
            for output in JobManager(settings).plan(found.job)["outputs"]:
                for sink in output["sinks"]:
                    if sink.get("location") == found.location:
                        return f"kappaflow/{found.job}/{output['name']}"
    return DEFAULT_APP_ID


@contextmanager
def _spark(settings: Settings) -> Iterator[SparkSession]:
    """A local Spark session for one command."""
    from kappaflow.spark.session import build_session

    session = build_session(settings, "kappaflow-lake")
    try:
        yield session
    finally:
        session.stop()


def _or_blank(value: object) -> object:
    return "" if value is None else value
