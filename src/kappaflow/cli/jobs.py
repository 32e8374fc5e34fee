"""``kappaflow jobs``: start, check, list, stop, remove, take savepoints of and read the
state and logs of streaming jobs; shadow, diff and promote a new version."""

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


def _reset_state(help_text: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return click.option("--reset-state", metavar="OUTPUT", multiple=True, help=help_text)


def _from_savepoint(help_text: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return click.option("--from-savepoint", metavar="LABEL", help=help_text)


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
@click.option(
    "--real-time",
    is_flag=True,
    help="run the --app job in Spark's real-time mode: JVM operators only, outputs at least once",
)
@_from_savepoint("start from savepoint LABEL (a label or a savepoint's folder)")
@_reset_state("with --from-savepoint: start OUTPUT's state afresh (repeatable)")
@pass_context
def start(
    ctx: Context,
    name: str,
    app: str | None,
    pipeline: str | None,
    params: tuple[str, ...],
    no_wait: bool,
    real_time: bool,
    from_savepoint: str | None,
    reset_state: tuple[str, ...],
) -> None:
    """Start job NAME; a job started again resumes from its checkpoint, or from a
    savepoint: its checkpoint, with its sinks put back where the savepoint found them."""
    if (app is None) == (pipeline is None):
        raise ConflictingOptionsError("give exactly one of --app and --pipeline")
    _importable_here()
    if real_time and app is None:
        raise ConflictingOptionsError("--real-time needs --app: a job on the job API")
    if real_time and from_savepoint is not None:
        raise ConflictingOptionsError("--real-time does not start from a savepoint")
    if reset_state and from_savepoint is None:
        raise ConflictingOptionsError("--reset-state needs --from-savepoint")
    if from_savepoint is not None:
        if app is None:
            raise ConflictingOptionsError("--from-savepoint needs --app: a job on the job API")
        from kappaflow.jobs.restore import restore

        restored = restore(
            ctx.settings, name, app, _parsed_params(params), from_savepoint, reset=reset_state
        )
        say(f"job {name} restored from savepoint {restored.label}")
        for output in reset_state:
            say(f"  output {output}: state reset: it starts afresh from its source's start")
    record = JobManager(ctx.settings).start(
        name,
        app or pipeline or "",
        _parsed_params(params),
        overrides=ctx.overrides,
        config_file=ctx.config_file,
        wait=not no_wait,
        real_time=real_time,
    )
    say(f"job {name} {record.state} (pid {record.pid})")


@jobs.command("check")
@click.argument("name", required=False)
@_app_options
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
@_from_savepoint("compare with savepoint LABEL instead of the job's checkpoint")
@_reset_state("with --from-savepoint: judge a start that resets OUTPUT's state (repeatable)")
@pass_context
def check(
    ctx: Context,
    name: str | None,
    app: str | None,
    params: tuple[str, ...],
    as_json: bool,
    from_savepoint: str | None,
    reset_state: tuple[str, ...],
) -> None:
    """Dry run: declare the job (NAME, default: the function's module) and print its plan:
    sources, outputs, sinks and guarantees. Nothing starts; a restart the job's
    checkpoint (or savepoint) cannot take is refused."""
    if app is None:
        raise ConflictingOptionsError("jobs check needs --app MODULE:FUNCTION")
    _importable_here()
    if reset_state and from_savepoint is None:
        raise ConflictingOptionsError("--reset-state needs --from-savepoint")
    if from_savepoint is not None:
        from kappaflow.jobs.restore import check as check_savepoint

        job_name = name or app.partition(":")[0].rsplit(".", 1)[-1]
        _savepoint, plan = check_savepoint(
            ctx.settings,
            job_name,
            app,
            _parsed_params(params),
            from_savepoint,
            reset=reset_state,
        )
    else:
        from kappaflow.jobs.check import check_app

        plan = check_app(ctx.settings, app, name, _parsed_params(params))
    if as_json:
        json_line(plan)
        return
    show_plan(plan)
    for change in plan.get("savepoint", {}).get("changes", []):
        where = f"output {change['output']}: " if change["output"] else ""
        click.echo(f"    taken: {where}{change['change']} ({change['why']})")
    for output, state in plan.get("savepoint", plan).get("state", {}).items():
        click.echo(f"    state of output {output}: {state}")


@jobs.command("savepoint")
@click.argument("name")
@click.option("--as", "label", metavar="LABEL", help="its label [default: the time, UTC]")
@click.option(
    "--timeout", default=120.0, show_default=True, help="seconds to wait for a running job"
)
@pass_context
def savepoint(ctx: Context, name: str, label: str | None, timeout: float) -> None:
    """Take a savepoint of job NAME, stopped or running: a copy of its checkpoint and of
    its sinks' progress (commit markers, serving-store keys, lake batches), to start the
    job from later (`jobs start --from-savepoint`). A running job's queries stop while it
    is copied, then start again."""
    from kappaflow.jobs.savepoints import take

    taken = take(ctx.settings, name, label, timeout=timeout)
    batches = ", ".join(f"{o} at batch {b}" for o, b in taken.summary()["batches"].items())
    say(f"savepoint {taken.label} of job {name} taken ({batches}): {taken.path}")


@jobs.command("savepoints")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines")
@pass_context
def savepoints(ctx: Context, name: str, as_json: bool) -> None:
    """Job NAME's savepoints, oldest first: label, when taken (UTC) and while the job
    was running or stopped, each output's last committed batch, the state's fingerprint
    (damaged ones last, with what is wrong)."""
    from kappaflow.jobs.savepoints import listing

    rows = listing(ctx.settings, name)
    if as_json:
        for row in rows:
            json_line(row)
        return
    table(
        None,
        ["label", "taken_at", "while", "batches", "plan"],
        [
            [r["label"], None, "damaged", r["damaged"], None]
            if "damaged" in r
            else [
                r["label"],
                r["taken_at"],
                r["taken_while"],
                " ".join(f"{o}@{b}" for o, b in r["batches"].items()),
                r["plan_fingerprint"][:12],
            ]
            for r in rows
        ],
    )


@jobs.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def status(ctx: Context, name: str, as_json: bool) -> None:
    """Job NAME's state and, per output, its accounting and progress: events read
    (measured from the source offsets processed) and passed, duplicates, late events,
    dead letters (and replayed dead letters read back), records written; watermark,
    state size, lag, batch duration."""
    from kappaflow.jobs.status import job_status

    found = job_status(ctx.settings, name)
    if as_json:
        json_line(found)
        return
    say(f"job {name}: {found['state']}" + (f" ({found['error']})" if found["error"] else ""))
    columns = [
        "output",
        "batch",
        "partitions",
        "events_read",
        "events",
        "duplicates",
        "late",
        "dead_letters",
        "dead_letters_replayed",
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
    from kappaflow.jobs.removal import remove_job

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


@jobs.command("state")
@click.argument("name")
@click.argument("output", required=False)
@click.option("--key", metavar="K", help="only key K: its value, or values joined by commas")
@click.option("--at", "at", metavar="SAVEPOINT", help="read a savepoint's state instead")
@pass_context
def state(ctx: Context, name: str, output: str | None, key: str | None, at: str | None) -> None:
    """Job NAME's state, running or stopped, as JSON lines: each window it holds open with
    its values, version and whether it is final; each key of a stateful function with its
    state and timers. Read as of the last committed batch (or from savepoint SAVEPOINT),
    without stopping the job. OUTPUT: that output's only."""
    from kappaflow.jobs.state_read import job_state

    for row in job_state(ctx.settings, name, output=output, key=key, at=at):
        json_line(row)


@jobs.command("logs")
@click.argument("name")
@click.option("-n", "--lines", default=50, show_default=True)
@pass_context
def logs(ctx: Context, name: str, lines: int) -> None:
    """The last lines of job NAME's driver log."""
    for line in JobManager(ctx.settings).log_lines(name, lines):
        click.echo(line)


@jobs.command("shadow")
@click.argument("name")
@_app_options
@click.option("--replay", is_flag=True, help="fresh state from the sources' start, always")
@click.option("--stop", "stop_", is_flag=True, help="stop the shadow and drop what it wrote")
@pass_context
def shadow(
    ctx: Context, name: str, app: str | None, params: tuple[str, ...], replay: bool, stop_: bool
) -> None:
    """Run a new version of live job NAME beside it as NAME.shadow, on the same sources,
    writing outputs of its own: from a savepoint of NAME where its state can take it, else
    with fresh state from the sources' start. --stop drops the shadow."""
    from kappaflow.jobs import shadows

    if stop_:
        if app is not None or params:
            raise ConflictingOptionsError("--stop takes no --app or -P")
        say(f"shadow {shadows.drop(ctx.settings, name)} of job {name} stopped and removed")
        return
    if app is None:
        raise ConflictingOptionsError("jobs shadow needs --app MODULE:FUNCTION (or --stop)")
    _importable_here()
    info = shadows.start(
        ctx.settings,
        name,
        app,
        _parsed_params(params),
        replay=replay,
        overrides=ctx.overrides,
        config_file=ctx.config_file,
    )
    started = info["started_from"]
    if started["replay"]:
        how = f"with fresh state from its sources' start: {started['why']}"
    else:
        how = f"from savepoint {started['savepoint']} of {name}"
    say(f"shadow {info['job']} of job {name} running, {how}")


@jobs.command("diff")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--sample", default=5, show_default=True, help="differences shown per output")
@pass_context
def diff(ctx: Context, name: str, as_json: bool, sample: int) -> None:
    """Per output, the windows whose final values differ between live job NAME and its
    shadow: counts, a sample and the first difference; aggregates only one side computes
    are listed as added or removed."""
    from kappaflow.jobs.diff import job_diff

    found = job_diff(ctx.settings, name, sample=sample)
    if as_json:
        json_line(found)
        return
    say(f"job {name} against {found['shadow']} ({found['shadow_state']}, {found['app']})")
    for output in found["outputs"]:
        if output["status"] != "compared":
            click.echo(f"  {output['output']}: output {output['status']}")
            continue
        aggregates = output["aggregates"]
        counts = " ".join(f"{k}={v}" for k, v in output["windows"].items())
        click.echo(f"  {output['output']}: {counts}")
        for kind in ("added", "removed"):
            if aggregates[kind]:
                click.echo(f"    aggregates {kind}: {', '.join(aggregates[kind])}")
        first = output["first_difference"]
        if first is not None:
            click.echo(
                f"    first difference: window {first['window_start']} key {first['key']}: "
                f"live {first['live']} shadow {first['shadow']}"
            )


@jobs.command("promote")
@click.argument("name")
@click.option(
    "--timeout", default=300.0, show_default=True, help="seconds for the shadow to catch up"
)
@pass_context
def promote(ctx: Context, name: str, timeout: float) -> None:
    """Stop live job NAME and let its shadow take over its outputs, exactly once: NAME
    runs the shadow's version from the shadow's state, and the shadow is dropped."""
    from kappaflow.jobs.promote import promote as promote_job

    done = promote_job(ctx.settings, name, timeout=timeout)
    bridged = sum(done["bridged"].values())
    say(
        f"job {name} runs {done['app']}: the shadow's state and outputs took over "
        f"({bridged} records bridged; savepoint {done['savepoint']} holds the version before)"
    )


@jobs.command("rescale")
@click.argument("name")
@click.option(
    "--partitions", type=int, required=True, help="the job's new shuffle and state partitions"
)
@click.option(
    "--as", "label", metavar="LABEL", help="its savepoint's label [default: rescale-TIME]"
)
@click.option("--restart", is_flag=True, help="stop a running job first, and start it again after")
@pass_context
def rescale(ctx: Context, name: str, partitions: int, label: str | None, restart: bool) -> None:
    """Change stopped job NAME's parallelism: its shuffle partitions and its state's,
    the state redistributed by key. A savepoint of the job before is taken first, to go
    back to (`jobs start --from-savepoint`)."""
    from kappaflow.jobs.rescale import rescale as rescale_job

    done = rescale_job(ctx.settings, name, partitions, label=label, restart=restart)
    changes = ", ".join(
        f"{o} {done.before[o]} -> {n}" for o, n in done.after.items() if o not in done.unchanged
    )
    kept = "".join(f"; {o} has no state and keeps its partitions" for o in done.unchanged)
    say(
        f"job {name} rescaled to {partitions} partitions ({changes}){kept}; savepoint "
        f"{done.savepoint.label} holds it as it was"
        + (f"; job {name} started again" if done.restarted else "")
    )
