"""``kappaflow jobs``: start, check, list, stop, remove and read the logs of streaming
jobs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table
from kappaflow.cli.plan import show_plan
from kappaflow.errors import ConflictingOptionsError, InvalidPairError
from kappaflow.jobs.manager import JobManager


@click.group()
def jobs() -> None:
    """Streaming jobs, each a Spark driver process of its own, managed by name."""


def _app_options(command: Callable[..., None]) -> Callable[..., None]:
    command = click.option(
        "-P",
        "--param",
        "params",
        multiple=True,
        metavar="KEY=VALUE",
        help="a job parameter (repeatable), e.g. -P source=events",
    )(command)
    return click.option(
        "--app",
        metavar="MODULE:FUNCTION",
        help="your job: the build(job) function declaring it, e.g. jobs.revenue:build",
    )(command)


def _parsed_params(params: tuple[str, ...]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for pair in params:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidPairError(f"invalid parameter {pair!r}: use KEY=VALUE")
        parsed[key] = value
    return parsed


def _importable_here() -> None:
    """Make the current directory importable, as ``python -m`` does: a user's job module
    is found beside them, in the CLI and in the job's driver (started in this directory)."""
    here = str(Path.cwd())
    if here not in sys.path:
        sys.path.insert(0, here)


@jobs.command("start")
@click.argument("name")
@_app_options
@click.option("--pipeline", help="a built-in pipeline (count, clean) or a Pipeline object")
@click.option("--no-wait", is_flag=True, help="return at once instead of when the job runs")
@pass_context
def start(
    ctx: Context,
    name: str,
    app: str | None,
    pipeline: str | None,
    params: tuple[str, ...],
    no_wait: bool,
) -> None:
    """Start job NAME; a job started again resumes from its checkpoint."""
    if (app is None) == (pipeline is None):
        raise ConflictingOptionsError("give exactly one of --app and --pipeline")
    _importable_here()
    record = JobManager(ctx.settings).start(
        name,
        app or pipeline or "",
        _parsed_params(params),
        overrides=ctx.overrides,
        config_file=ctx.config_file,
        wait=not no_wait,
    )
    say(f"job {name} {record.state} (pid {record.pid})")


@jobs.command("check")
@click.argument("name", required=False)
@_app_options
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
@pass_context
def check(
    ctx: Context, name: str | None, app: str | None, params: tuple[str, ...], as_json: bool
) -> None:
    """Dry run: declare the job (NAME, default: the function's module) and print its plan:
    sources, outputs, sinks and guarantees. Nothing starts; a restart the job's
    checkpoint cannot take is refused."""
    if app is None:
        raise ConflictingOptionsError("jobs check needs --app MODULE:FUNCTION")
    _importable_here()
    from kappaflow.streams.check import check_app

    plan = check_app(ctx.settings, app, name, _parsed_params(params))
    if as_json:
        json_line(plan)
    else:
        show_plan(plan)


@jobs.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def status(ctx: Context, name: str, as_json: bool) -> None:
    """Job NAME's state and, per output, its accounting and progress: events read
    (measured from the source offsets processed) and passed, duplicates, late events,
    dead letters, records written; watermark, state size, lag, batch duration."""
    from kappaflow.streams.status import job_status

    found = job_status(ctx.settings, name)
    if as_json:
        json_line(found)
        return
    say(f"job {name}: {found['state']}" + (f" ({found['error']})" if found["error"] else ""))
    columns = [
        "output",
        "batch",
        "events_read",
        "events",
        "duplicates",
        "late",
        "dead_letters",
        "kafka_records",
        "lake_rows",
        "event_time_watermark",
        "state_rows",
        "lag_records",
        "batch_duration_ms",
    ]
    table(
        None, columns, [[o, *(v.get(c) for c in columns[1:])] for o, v in found["outputs"].items()]
    )


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


@jobs.command("remove")
@click.argument("name")
@pass_context
def remove(ctx: Context, name: str) -> None:
    """Forget stopped job NAME: its checkpoint, commit markers, serving-store keys, lake
    tables and the topics named after it. Started again, NAME begins from nothing."""
    from kappaflow.cli.count import PIPELINE as COUNT
    from kappaflow.counting import lifecycle
    from kappaflow.streams.removal import remove_job

    record = JobManager(ctx.settings).get(name)
    if record.pipeline in (COUNT, "kappaflow.counting.pipeline:PIPELINE"):
        deleted = lifecycle.remove(ctx.settings, name)
        say(f"job {name} removed, with its checkpoint, its Redis keys and {len(deleted)} topics")
        return
    removal = remove_job(ctx.settings, name)
    say(
        f"job {name} removed, with its checkpoint, {_count(removal.redis_keys, 'Redis key')}, "
        f"{_count(len(removal.lakes), 'lake table')} and {_count(len(removal.topics), 'topic')}"
        + "".join(f"; kept topic {t} (named by a sink)" for t in removal.kept_topics)
        + "".join(f"; left {at} (not on this machine: delete it there)" for at in removal.left)
    )


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


@jobs.command("logs")
@click.argument("name")
@click.option("-n", "--lines", default=50, show_default=True)
@pass_context
def logs(ctx: Context, name: str, lines: int) -> None:
    """The last lines of job NAME's driver log."""
    for line in JobManager(ctx.settings).log_lines(name, lines):
        click.echo(line)
