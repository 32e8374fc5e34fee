"""``kappaflow mirror start | stop | status | logs``: replication to a backup cluster."""

from __future__ import annotations

from typing import Any

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table
from kappaflow.kafka.mirror import Mirror


@click.group()
def mirror() -> None:
    """Replicate topics and consumer-group offsets to a backup cluster (MirrorMaker 2)."""


@mirror.command("start")
@click.option("--to", "target", metavar="HOST:PORT[,…]", help="the backup cluster [mirror.target]")
@click.option("--topics", metavar="REGEX", help="the topics to replicate [mirror.topics]")
@click.option(
    "--groups", metavar="REGEX", help="the groups whose offsets to translate [mirror.groups]"
)
@pass_context
def start(ctx: Context, target: str | None, topics: str | None, groups: str | None) -> None:
    """Start MirrorMaker from the configured Kafka (the primary) to the backup, topic names
    unchanged, and wait until it replicates. Both clusters must answer first."""
    found = Mirror(ctx.settings)
    started = found.start(target=target, topics=topics, groups=groups)
    plan = found.plan()
    where = f"{plan.primary} -> {plan.backup}, topics {plan.topics!r}" if plan else ""
    say(f"mirror {'started' if started else 'already running'}: {where}".rstrip(": "))


@mirror.command("stop")
@click.option("--timeout", default=60.0, show_default=True, help="seconds before SIGKILL")
@pass_context
def stop(ctx: Context, timeout: float) -> None:
    """Stop MirrorMaker; what the backup holds stays."""
    stopped = Mirror(ctx.settings).stop(timeout=timeout)
    say("mirror stopped" if stopped else "mirror was not running")


@mirror.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def status(ctx: Context, as_json: bool) -> None:
    """Whether MirrorMaker runs, what it replicates, each mirrored partition's end offsets
    on both clusters, its lag and the newest record time the backup holds, and the
    consumer groups' last checkpoints."""
    from kappaflow.kafka.mirror_status import report

    found = report(Mirror(ctx.settings))
    if as_json:
        json_line(found)
        return
    _print(found)


@mirror.command("logs")
@click.option("-n", "--lines", default=50, show_default=True, help="how many lines")
@pass_context
def logs(ctx: Context, lines: int) -> None:
    """The last lines of MirrorMaker's log."""
    for line in Mirror(ctx.settings).logs(lines):
        click.echo(line)


def _print(found: dict[str, Any]) -> None:
    head = ["state", "pid", "primary", "backup", "topics", "groups"]
    extra = ["mirrored_until", "last_checkpoint"]
    keys = head + [k for k in extra if k in found]
    table(None, keys, [[found.get(k) for k in keys]])
    connectors = found.get("connectors")
    if connectors:
        table(None, ["connector", "state"], sorted(connectors.items()))
    partitions = found.get("partitions")
    if partitions:
        columns = ["topic", "partition", "primary_end", "backup_end", "lag", "mirrored_until"]
        table(None, columns, [[p[c] for c in columns] for p in partitions])
    held = found.get("checkpoints")
    if held:
        columns = ["group", "topic", "partition", "primary_offset", "backup_offset", "at"]
        table(None, columns, [[c[k] for k in columns] for c in held])
    for cluster in found.get("unreachable") or []:
        say(f"the {cluster} cluster does not answer")
