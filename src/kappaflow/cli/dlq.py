"""``kappaflow dlq show | replay``: a job's dead letters, listed with their reasons and
sent (fixed) back through the job, exactly once (docs/dead-letters.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table


@click.group()
def dlq() -> None:
    """A job's dead letters: the records it could not take, with the reason."""


@dlq.command("show")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines, the bytes too")
@click.option("--limit", type=click.IntRange(min=1), help="at most this many")
@click.option("--pending", is_flag=True, help="only those no replay has passed yet")
@pass_context
def show(ctx: Context, job: str, as_json: bool, limit: int | None, pending: bool) -> None:
    """Dead letters of JOB (in JOB.dlq): where each is, why, where it came from, whether
    a replay has passed it, and its original bytes."""
    from kappaflow.jobs.dead_letters import dead_letters

    found = dead_letters(ctx.settings, job)
    if pending:
        found = [letter for letter in found if not letter.replayed]
    if limit is not None:
        found = found[:limit]
    if as_json:
        for letter in found:
            json_line(letter.as_json())
        return
    rows = []
    for letter in found:
        text = letter.as_json()["value"]
        shown = text if text is not None else ("<binary>" if letter.value else "<empty>")
        source = (
            f"{letter.source_topic}/{letter.source_partition}/{letter.source_offset}"
            if letter.source_topic
            else ""
        )
        rows.append(
            [
                f"{letter.partition}:{letter.offset}",
                letter.reason,
                source,
                "replayed" if letter.replayed else "pending",
                letter.replay_of or "",
                shown if len(shown) <= 60 else shown[:57] + "...",
            ]
        )
    table(None, ["dead_letter", "reason", "source", "state", "replay_of", "value"], rows)
    say(f"{len(found)} dead letters of {job}")


@dlq.command("replay")
@click.argument("job")
@click.option(
    "--fix",
    metavar="MODULE:FUNCTION",
    help="a function of (original bytes, reason) returning the bytes to send, or None "
    "to pass the dead letter over",
)
@click.option(
    "--chunk",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="dead letters per transaction",
)
@pass_context
def replay(ctx: Context, job: str, fix: str | None, chunk: int) -> None:
    """Send JOB's dead letters that no replay has passed back into the topics they came
    from, fixed by --fix, exactly once; the job takes them as new records (a replay
    header says which dead letter each is) and counts them. Prints one JSON object."""
    from kappaflow.jobs.dead_letters import load_fix
    from kappaflow.jobs.dead_letters import replay as replay_letters

    here = str(Path.cwd())
    if here not in sys.path:
        # A fix module beside the user, as for `jobs start --app`.
        sys.path.insert(0, here)
    function = load_fix(fix) if fix is not None else None
    report = replay_letters(ctx.settings, job, fix=function, chunk=chunk)
    json_line(report.as_json())
    say(
        f"replayed {report.replayed} of {report.read} dead letters of {job} "
        f"({report.skipped} passed over, {report.unroutable} not replayable) "
        f"in {report.transactions} transactions"
    )
