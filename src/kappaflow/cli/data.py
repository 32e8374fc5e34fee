"""``produce``, ``consume``, ``replay``: records in and out of topics as JSON lines."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from datetime import datetime

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, stderr
from kappaflow.errors import InputError
from kappaflow.kafka import records
from kappaflow.timeutil import parse_time


class TimeParam(click.ParamType):  # type: ignore[type-arg]
    name = "TIME"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_time(str(value))
        except InputError as exc:
            self.fail(str(exc), param, ctx)


TIME = TimeParam()


def _progress(description: str) -> Progress:
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    )


@click.command()
@click.argument("topic")
@click.option("-k", "--key-field", metavar="FIELD", help="use this field of each object as key")
@pass_context
def produce(ctx: Context, topic: str, key_field: str | None) -> None:
    """Send JSON lines from stdin to TOPIC, one record per line.

    Invalid lines are reported with their numbers and not sent; the exit status is 1
    if any line was invalid.
    """
    with _progress("sending") as bar:
        task = bar.add_task("send", total=None)
        report = records.produce_lines(
            ctx.settings.kafka,
            topic,
            _stdin_lines(),
            key_field=key_field,
            progress=lambda sent: bar.update(task, completed=sent),
        )
    for number, reason in report.invalid:
        say(f"line {number}: {reason}")
    say(
        f"sent {report.sent} records to {topic}"
        + (f"; {len(report.invalid)} invalid lines not sent" if report.invalid else "")
    )
    if report.invalid:
        sys.exit(1)


def _stdin_lines() -> Iterator[str]:
    # Undecodable bytes become U+FFFD, so such a line fails as "not JSON" with its number.
    yield from io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")


@click.command()
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="start at the first retained record")
@click.option("--offset", type=click.IntRange(min=0), help="start at this offset (each partition)")
@click.option("--since", type=TIME, help="start at the first record stamped at or after TIME")
@click.option("--until", type=TIME, help="stop each partition after TIME")
@click.option(
    "-n", "--max", "max_records", type=click.IntRange(min=0), help="stop after this many records"
)
@click.option("-p", "--partition", type=click.IntRange(min=0), help="read only this partition")
@click.option(
    "--follow/--no-follow",
    default=None,
    help="wait for new records at the end [default: only when starting at the end]",
)
@pass_context
def consume(
    ctx: Context,
    topic: str,
    from_beginning: bool,
    offset: int | None,
    since: datetime | None,
    until: datetime | None,
    max_records: int | None,
    partition: int | None,
    follow: bool | None,
) -> None:
    """Print records of TOPIC as JSON lines (value plus topic, partition, offset, time, key).

    TIME is ISO-8601 with a zone (2026-11-21T10:00:00Z), epoch milliseconds, 'now',
    or a duration ago (15m). Without a start option, only new records are printed.
    """
    starts = [from_beginning, offset is not None, since is not None]
    if sum(starts) > 1:
        raise click.UsageError("use only one of --from-beginning, --offset and --since")
    start = records.StartAt(beginning=from_beginning, offset=offset, since=since)
    for message in records.read_records(
        ctx.settings.kafka,
        topic,
        start=start,
        until=until,
        max_records=max_records,
        partition=partition,
        follow=follow,
    ):
        json_line(records.to_json_record(message))
        sys.stdout.flush()


@click.command()
@click.argument("source")
@click.argument("dest")
@click.option("--since", type=TIME, required=True, help="first record time to copy")
@click.option("--until", type=TIME, help="last record time to copy [default: the end]")
@pass_context
def replay(ctx: Context, source: str, dest: str, since: datetime, until: datetime | None) -> None:
    """Copy the records of SOURCE stamped between --since and --until into DEST.

    Keys, values, headers and timestamps are kept; DEST is created like SOURCE if needed.
    """
    with _progress("replaying") as bar:
        task = bar.add_task("replay", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        copied = records.replay(
            ctx.settings.kafka, source, dest, since=since, until=until, progress=advance
        )
    say(f"replayed {copied} records from {source} to {dest}")


COMMANDS = (produce, consume, replay)
