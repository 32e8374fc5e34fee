"""``kappaflow count start | status | stop | remove`` and ``kappaflow counts``."""

from __future__ import annotations

from dataclasses import replace

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say
from kappaflow.counting import lifecycle
from kappaflow.counting.failover import start_from
from kappaflow.counting.spec import CountSpec, duration_ms
from kappaflow.counting.status import count_status
from kappaflow.counting.store import CountStore
from kappaflow.errors import NotACountJobError
from kappaflow.jobs.manager import JobManager, JobRecord
from kappaflow.jobs.pipeline import pipeline_target
from kappaflow.kafka.topics import topic_partitions
from kappaflow.serving.client import redis_client
from kappaflow.timeutil import parse_time

PIPELINE = "count"


@click.group()
def count() -> None:
    """Continuous counting per key per event-time window, with corrections, late events
    and dead letters."""


@count.command("start")
@click.argument("name")
@click.option("--source", required=True, help="topic of JSON events")
@click.option("--key", "key_field", required=True, metavar="FIELD", help="what to count by")
@click.option(
    "--time",
    "time_field",
    required=True,
    metavar="FIELD",
    help="event time: epoch ms (number or numeric string) or ISO-8601 with a zone",
)
@click.option("--id", "id_field", metavar="FIELD", help="drop repeated events by this id")
@click.option("--window", metavar="DURATION", help="window length, e.g. 1m")
@click.option("--slide", metavar="DURATION", help="slide of a sliding window")
@click.option(
    "--session-gap",
    metavar="DURATION",
    help="session windows: a key's events closer than this form one window",
)
@click.option(
    "--watermark",
    default="10s",
    show_default=True,
    metavar="DURATION",
    help="how far event time may run behind the largest seen",
)
@click.option(
    "--allowed-lateness",
    default="0s",
    show_default=True,
    metavar="DURATION",
    help="how long after the watermark a window still takes corrections",
)
@click.option(
    "--realtime",
    is_flag=True,
    help="also provisional counts in Spark real-time mode, within milliseconds",
)
@click.option("--available-now", is_flag=True, help="count what the topic holds, then stop")
@click.option(
    "--from-time",
    metavar="TIME",
    help="read the source from its first records stamped at or after TIME; a job that ran "
    "keeps its state and moves its offsets there (failover to a backup cluster)",
)
@pass_context
def start(
    ctx: Context,
    name: str,
    source: str,
    key_field: str,
    time_field: str,
    id_field: str | None,
    window: str | None,
    slide: str | None,
    session_gap: str | None,
    watermark: str,
    allowed_lateness: str,
    realtime: bool,
    available_now: bool,
    from_time: str | None,
) -> None:
    """Start counting job NAME; started again, it resumes from its checkpoint."""
    spec = CountSpec(
        source=source,
        key_field=key_field,
        time_field=time_field,
        id_field=id_field,
        window_ms=duration_ms(window),
        slide_ms=duration_ms(slide),
        session_gap_ms=duration_ms(session_gap),
        watermark_ms=duration_ms(watermark) or 0,
        allowed_lateness_ms=duration_ms(allowed_lateness) or 0,
        realtime=realtime,
        available_now=available_now,
    )
    # Fail here, not in the background: Redis down or the source missing starts no job.
    redis_client(ctx.settings)
    topic_partitions(ctx.settings.kafka, source)
    if from_time is not None:
        start_at, moved = start_from(ctx.settings, name, source, parse_time(from_time))
        spec = replace(spec, start=start_at)
        for line in moved:
            say(f"count job {name} goes on from {from_time}: {line}")
    record = JobManager(ctx.settings).start(
        name, PIPELINE, spec.to_params(), overrides=ctx.overrides, config_file=ctx.config_file
    )
    say(f"count job {name} {record.state} (pid {record.pid})")


@count.command("stop")
@click.argument("name")
@pass_context
def stop(ctx: Context, name: str) -> None:
    """Stop counting job NAME (its checkpoint stays, to resume from)."""
    record = JobManager(ctx.settings).stop(name)
    say(f"count job {name} {record.state}")


@count.command("remove")
@click.argument("name")
@pass_context
def remove(ctx: Context, name: str) -> None:
    """Forget stopped counting job NAME: its checkpoint, its counts in Redis and its
    topics. Started again, NAME counts from the start of its source."""
    _counting_job(ctx, name)
    deleted = lifecycle.remove(ctx.settings, name)
    say(f"count job {name} removed, with its checkpoint, its Redis keys and {len(deleted)} topics")


@count.command("status")
@click.argument("name")
@pass_context
def status(ctx: Context, name: str) -> None:
    """One JSON object: events read (measured from the source offsets the job consumed)
    beside those accounted for (counted, duplicates, late, dead letters), watermark, open
    windows, state size, last batch, lag."""
    json_line(count_status(ctx.settings, _counting_job(ctx, name)))


def _counting_job(ctx: Context, name: str) -> JobRecord:
    """Job ``name``'s record; an error if there is none or it is not a counting job."""
    record = JobManager(ctx.settings).get(name)
    if pipeline_target(record.pipeline) != pipeline_target(PIPELINE):
        raise NotACountJobError(f"job {name!r} is not a counting job")
    return record


@click.command()
@click.argument("name")
@click.option("--key", help="only this key")
@click.option("--final-only", is_flag=True, help="only windows the watermark has passed")
@click.option("--from-state", is_flag=True, help="read the job's own Spark state instead")
@pass_context
def counts(ctx: Context, name: str, key: str | None, final_only: bool, from_state: bool) -> None:
    """The current count of every window of job NAME, as JSON lines."""
    _counting_job(ctx, name)
    if from_state:
        from kappaflow.counting.state import read_state

        rows = read_state(ctx.settings, name)
    else:
        rows = list(CountStore(redis_client(ctx.settings), name).windows(key))
    for row in rows:
        if (key is None or row.key == key) and (row.final or not final_only):
            json_line(row.as_json())


COMMANDS = (count, counts)
