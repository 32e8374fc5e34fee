"""``kappaflow topics``: create, list, describe, delete."""

from __future__ import annotations

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say
from kappaflow.kafka import topics as ops


@click.group()
def topics() -> None:
    """Create, list, describe and delete topics (JSON lines out)."""


@topics.command("create")
@click.argument("name")
@click.option(
    "-p",
    "--partitions",
    default=ops.DEFAULT_PARTITIONS,
    show_default="this machine's cores",
    type=click.IntRange(min=1),
)
@click.option(
    "-r",
    "--replication-factor",
    type=click.IntRange(min=1),
    help="replicas of each partition [default: the cluster's, 3 on the embedded cluster "
    "of three or more nodes, else 1]",
)
@click.option(
    "-c",
    "--config",
    "configs",
    multiple=True,
    metavar="KEY=VALUE",
    help="a topic config, e.g. retention.ms=86400000 (repeatable)",
)
@click.option("--if-not-exists", is_flag=True, help="succeed if the topic already exists")
@pass_context
def create(
    ctx: Context,
    name: str,
    partitions: int,
    replication_factor: int | None,
    configs: tuple[str, ...],
    if_not_exists: bool,
) -> None:
    """Create topic NAME."""
    created = ops.create_topic(
        ctx.settings.kafka,
        name,
        partitions=partitions,
        replication_factor=replication_factor,
        configs=ops.parse_configs(configs),
        exist_ok=if_not_exists,
    )
    say(f"created topic {name}" if created else f"topic {name} already exists")


@topics.command("list")
@click.option("--internal", is_flag=True, help="include internal topics (__consumer_offsets …)")
@pass_context
def list_(ctx: Context, internal: bool) -> None:
    """One JSON line per topic: name and partition count."""
    for row in ops.list_topics(ctx.settings.kafka, include_internal=internal):
        json_line(row)


@topics.command("describe")
@click.argument("name")
@pass_context
def describe(ctx: Context, name: str) -> None:
    """Partitions (leader, replicas, ISR, offsets) and non-default configs of NAME."""
    json_line(ops.describe_topic(ctx.settings.kafka, name))


@topics.command("delete")
@click.argument("name")
@pass_context
def delete(ctx: Context, name: str) -> None:
    """Delete topic NAME and all its records."""
    ops.delete_topic(ctx.settings.kafka, name)
    say(f"deleted topic {name}")
