"""``kappaflow connect start | stop | status | logs | create | delete``: change data
capture from PostgreSQL through a Kafka Connect worker and Debezium (docs/cdc.md)."""

from __future__ import annotations

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table
from kappaflow.kafka.connect import ConnectWorker


@click.group()
def connect() -> None:
    """Change data capture: a Kafka Connect worker with Debezium's PostgreSQL connector."""


@connect.command("start")
@pass_context
def start(ctx: Context) -> None:
    """Start the Connect worker (its state in topics of the configured Kafka) and wait
    until its REST API answers. Connectors created before resume."""
    worker = ConnectWorker(ctx.settings)
    started = worker.start()
    say(f"connect {'started' if started else 'already running'}: {worker.url}")


@connect.command("stop")
@click.option("--timeout", default=60.0, show_default=True, help="seconds before SIGKILL")
@pass_context
def stop(ctx: Context, timeout: float) -> None:
    """Stop the Connect worker; its connectors stay configured and resume at the next start."""
    stopped = ConnectWorker(ctx.settings).stop(timeout=timeout)
    say("connect stopped" if stopped else "connect was not running")


@connect.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def status(ctx: Context, as_json: bool) -> None:
    """Whether the worker runs, and each connector's and task's state."""
    found = ConnectWorker(ctx.settings).status()
    if as_json:
        json_line(found)
        return
    table(None, ["state", "pid", "url"], [[found["state"], found["pid"], found["url"]]])
    connectors = found.get("connectors") or {}
    if connectors:
        rows = [[n, c["state"], ",".join(c["tasks"])] for n, c in connectors.items()]
        table(None, ["connector", "state", "tasks"], rows)
    if "error" in found:
        say(found["error"])


@connect.command("logs")
@click.option("-n", "--lines", default=50, show_default=True, help="how many lines")
@pass_context
def logs(ctx: Context, lines: int) -> None:
    """The last lines of the Connect worker's log."""
    for line in ConnectWorker(ctx.settings).logs(lines):
        click.echo(line)


@connect.command("create")
@click.argument("name")
@click.option(
    "--postgres",
    "dsn",
    metavar="DSN",
    help="postgresql://user:password@host:port/db [postgres.dsn, else the embedded server]",
)
@click.option(
    "--tables",
    required=True,
    metavar="T1,T2",
    help="the tables to capture, schema.table (public when bare), comma-separated",
)
@pass_context
def create(ctx: Context, name: str, dsn: str | None, tables: str) -> None:
    """Capture TABLES' inserts, updates and deletes into the topics NAME.SCHEMA.TABLE
    (Debezium's JSON envelope, keyed by primary key; a snapshot of the rows first), and
    wait until the connector runs."""
    chosen = dsn or ctx.settings.postgres.effective_dsn
    wanted = [t.strip() for t in tables.split(",") if t.strip()]
    ConnectWorker(ctx.settings).create_postgres(name, chosen, wanted)
    topics = ", ".join(f"{name}.{t if '.' in t else 'public.' + t}" for t in wanted)
    say(f"connector {name} runs: {topics}")


@connect.command("delete")
@click.argument("name")
@click.option(
    "--keep-slot",
    is_flag=True,
    help="keep the replication slot and publication in PostgreSQL (to create it again "
    "and go on from where it was)",
)
@pass_context
def delete(ctx: Context, name: str, keep_slot: bool) -> None:
    """Remove a connector and drop its replication slot and publication in PostgreSQL (an
    orphaned slot holds back the database's log forever); its topics stay."""
    dropped = ConnectWorker(ctx.settings).delete(name, keep_slot=keep_slot)
    say(f"connector {name} deleted" + (f"; dropped {' and '.join(dropped)}" if dropped else ""))
