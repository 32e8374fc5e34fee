"""``kappaflow jobs``: start, list, stop and read the logs of streaming jobs."""

from __future__ import annotations

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table
from kappaflow.errors import InvalidPairError
from kappaflow.jobs.manager import JobManager


@click.group()
def jobs() -> None:
    """Streaming jobs, each a Spark driver process of its own, managed by name."""


@jobs.command("start")
@click.argument("name")
@click.option("--pipeline", required=True, help="what the job computes (e.g. clean)")
@click.option(
    "-P",
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="a pipeline parameter (repeatable), e.g. -P source=events",
)
@click.option("--no-wait", is_flag=True, help="return at once instead of when the job runs")
@pass_context
def start(ctx: Context, name: str, pipeline: str, params: tuple[str, ...], no_wait: bool) -> None:
    """Start job NAME; a job started again resumes from its checkpoint."""
    parsed: dict[str, str] = {}
    for pair in params:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidPairError(f"invalid parameter {pair!r}: use KEY=VALUE")
        parsed[key] = value
    record = JobManager(ctx.settings).start(
        name,
        pipeline,
        parsed,
        overrides=ctx.overrides,
        config_file=ctx.config_file,
        wait=not no_wait,
    )
    say(f"job {name} {record.state} (pid {record.pid})")


@jobs.command("list")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines")
@pass_context
def list_(ctx: Context, as_json: bool) -> None:
    """Every job: name, driver pid, state, start time, pipeline."""
    rows = [
        {
            "name": r.name,
            "pid": r.pid,
            "state": r.state,
            "started_at": r.started_at,
            "pipeline": r.pipeline,
            "error": r.error,
        }
        for r in JobManager(ctx.settings).records()
    ]
    if as_json:
        for row in rows:
            json_line(row)
    else:
        table(
            None,
            ["name", "pid", "state", "started_at", "pipeline"],
            [[r["name"], r["pid"], r["state"], r["started_at"], r["pipeline"]] for r in rows],
        )


@jobs.command("stop")
@click.argument("name")
@click.option("--timeout", default=60.0, show_default=True, help="seconds before SIGKILL")
@pass_context
def stop(ctx: Context, name: str, timeout: float) -> None:
    """Stop job NAME: its queries stop cleanly; SIGKILL after the timeout."""
    record = JobManager(ctx.settings).stop(name, timeout=timeout)
    say(f"job {name} {record.state}")


@jobs.command("logs")
@click.argument("name")
@click.option("-n", "--lines", default=50, show_default=True)
@pass_context
def logs(ctx: Context, name: str, lines: int) -> None:
    """The last lines of job NAME's driver log."""
    for line in JobManager(ctx.settings).log_lines(name, lines):
        click.echo(line)
