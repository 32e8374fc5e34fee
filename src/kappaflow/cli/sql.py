"""``kappaflow sql``: a read-only SQL query over the lake tables, run in this process.

The same engine, lock-down and limits as the service's ``POST /v1/sql``
(kappaflow.api.sql); no service needs to run.
"""

from __future__ import annotations

from typing import Any

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table


@click.command("sql")
@click.argument("query", required=False)
@click.option("--tables", is_flag=True, help="list the lake tables and their columns instead")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines: one object per row")
@click.option(
    "--version",
    "versions",
    multiple=True,
    metavar="JOB.TABLE=N",
    help="read a table as it was at version N (time travel; `kappaflow lake history`)",
)
@pass_context
def sql(
    ctx: Context, query: str | None, tables: bool, as_json: bool, versions: tuple[str, ...]
) -> None:
    """Run one SELECT QUERY over the jobs' lake tables ("<job>".<table>), committed rows
    only, within api.sql_timeout_s and api.sql_max_rows."""
    from kappaflow.api.sql import describe_tables, run_sql

    if tables and query is not None:
        raise click.UsageError("give a QUERY or --tables, not both")
    if query is None:
        if not tables:
            raise click.UsageError('give a QUERY, such as "SELECT 42", or --tables')
        _show_tables(describe_tables(ctx.settings), as_json)
        return
    answer = run_sql(ctx.settings, query, versions=_versions(versions))
    names = [column["name"] for column in answer.columns]
    if as_json:
        for row in answer.rows:
            json_line(dict(zip(names, row, strict=True)))
    else:
        table(None, names, answer.rows)
    if answer.truncated:
        say(
            f"the first {len(answer.rows)} rows: the query has more (api.sql_max_rows); "
            "add a LIMIT or an aggregate"
        )


def _versions(given: tuple[str, ...]) -> dict[str, int]:
    versions = {}
    for item in given:
        name, sep, number = item.rpartition("=")
        if not sep or not name or not number.isdigit():
            raise click.UsageError(f"--version {item!r}: give JOB.TABLE=N, such as shop.orders=3")
        versions[name] = int(number)
    return versions


def _show_tables(found: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        for item in found:
            json_line(item)
        return
    table(
        None,
        ["table", "rows", "files", "columns"],
        [
            [
                item["table"],
                item["rows"],
                item["files"],
                ", ".join(f"{c['name']} {c['type']}" for c in item["columns"]),
            ]
            for item in found
        ],
    )
