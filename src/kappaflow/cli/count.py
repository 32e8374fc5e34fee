"""``kappaflow count start | status | stop | remove`` and ``kappaflow counts``."""

from __future__ import annotations

from typing import Any

import click
from confluent_kafka import TopicPartition

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say
from kappaflow.counting import outputs
from kappaflow.counting.spec import REALTIME_PART, CountSpec, millis
from kappaflow.counting.store import CountStore
from kappaflow.errors import JobError
from kappaflow.jobs.manager import JobManager
from kappaflow.jobs.parts import part_state
from kappaflow.serving.client import redis_client
from kappaflow.timeutil import from_epoch_ms, iso

PIPELINE = "count"


@click.group()
def count() -> None:
    """Continuous counting per key per event-time window (see README, "Counting")."""


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
) -> None:
    """Start counting job NAME; started again, it resumes from its checkpoint."""
    spec = CountSpec(
        source=source,
        key_field=key_field,
        time_field=time_field,
        id_field=id_field,
        window_ms=millis(window),
        slide_ms=millis(slide),
        session_gap_ms=millis(session_gap),
        watermark_ms=millis(watermark) or 0,
        allowed_lateness_ms=millis(allowed_lateness) or 0,
        realtime=realtime,
        available_now=available_now,
    )
    redis_client(ctx.settings)  # fail here, not in the background, if Redis is down
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
    record = JobManager(ctx.settings).get(name)
    if record.pipeline != PIPELINE:
        raise JobError(f"job {name!r} is not a counting job")
    deleted = outputs.remove(ctx.settings, name)
    say(f"count job {name} removed, with its checkpoint, its Redis keys and {len(deleted)} topics")


@count.command("status")
@click.argument("name")
@pass_context
def status(ctx: Context, name: str) -> None:
    """One JSON object: events read, counted, duplicates, late, dead letters, watermark,
    open windows, state size, last batch, lag."""
    jobs = JobManager(ctx.settings)
    record = jobs.get(name)
    if record.pipeline != PIPELINE:
        raise JobError(f"job {name!r} is not a counting job")
    stats = CountStore(redis_client(ctx.settings), name).stats()
    progress = jobs.progress(name).get(name) or {}
    counted, dups = stats.get("counted", 0), stats.get("duplicates", 0)
    late, dead = stats.get("late", 0), stats.get("dlq", 0)
    operators = progress.get("stateOperators") or [{}]
    parts = {}
    if CountSpec.from_params(record.params).realtime:
        # The real-time query's driver process (counting/pipeline.py, REALTIME_PART).
        parts["realtime"] = part_state(jobs.job_dir(name), REALTIME_PART)
    json_line(
        {
            "name": name,
            "state": record.state,
            **parts,
            "events_read": counted + dups + late + dead,
            "counted": counted,
            "duplicates_dropped": dups,
            "late": late,
            "dead_letters": dead,
            "watermark": _watermark(progress, stats),
            "open_windows": stats.get("open_windows", 0),
            "window_keys": stats.get("window_keys", 0),
            "state_rows": sum(int(op.get("numRowsTotal", 0)) for op in operators),
            "state_bytes": sum(int(op.get("memoryUsedBytes", 0)) for op in operators),
            "last_batch": {
                "id": progress.get("batchId"),
                "at": progress.get("timestamp"),
                "input_rows": progress.get("numInputRows"),
                "duration_ms": (progress.get("durationMs") or {}).get("triggerExecution"),
            },
            "lag": _lag(ctx, progress),
        }
    )


def _watermark(progress: dict[str, Any], stats: dict[str, int]) -> str | None:
    """The job's watermark: from its last progress, else the highest the store has seen."""
    from_progress = (progress.get("eventTime") or {}).get("watermark")
    if from_progress and not str(from_progress).startswith("1970"):
        return str(from_progress)
    millis = stats.get("watermark", 0)
    return iso(from_epoch_ms(millis)) if millis > 0 else None


def _lag(ctx: Context, progress: dict[str, Any]) -> int | None:
    """Records in the source not yet read by the job (None before its first batch)."""
    import json

    from kappaflow.kafka.clients import consumer

    sources = progress.get("sources") or []
    if not sources or not sources[0].get("endOffset"):
        return None
    offsets = json.loads(sources[0]["endOffset"])
    reader = consumer(ctx.settings.kafka)
    try:
        lag = 0
        for topic, parts in offsets.items():
            for part, done in parts.items():
                _, high = reader.get_watermark_offsets(
                    TopicPartition(topic, int(part)), timeout=ctx.settings.kafka.timeout_s
                )
                lag += max(0, high - int(done))
        return lag
    finally:
        reader.close()


@click.command()
@click.argument("name")
@click.option("--key", help="only this key")
@click.option("--final-only", is_flag=True, help="only windows the watermark has passed")
@click.option("--from-state", is_flag=True, help="read the job's own Spark state instead")
@pass_context
def counts(ctx: Context, name: str, key: str | None, final_only: bool, from_state: bool) -> None:
    """The current count of every window of job NAME, as JSON lines."""
    if from_state:
        from kappaflow.counting.state import read_state

        rows = read_state(ctx.settings, name)
    else:
        rows = list(CountStore(redis_client(ctx.settings), name).windows(key))
    for row in rows:
        if (key is None or row.key == key) and (row.final or not final_only):
            json_line(row.as_json())


COMMANDS = (count, counts)
