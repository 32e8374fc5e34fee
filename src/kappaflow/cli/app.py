"""The root command: global options and lazily loaded settings."""

from __future__ import annotations

from pathlib import Path

import click

from kappaflow import __version__
from kappaflow.cli import access, count, data, demo, iot, jobs, services, spark, sql, topics
from kappaflow.cli import api as _api_serve  # noqa: F401 (adds `api serve`)
from kappaflow.cli.context import Context, settings_options
from kappaflow.cli.mirror import mirror


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kappaflow")
@settings_options
@click.pass_context
def cli(
    ctx: click.Context,
    config_file: Path | None,
    state_dir: Path | None,
    bootstrap_servers: str | None,
    spark_master: str | None,
    redis_url: str | None,
) -> None:
    """kappaflow: Kafka as the event log, Spark Structured Streaming as the engine.

    Settings come from these flags, then KAPPAFLOW_* environment variables, then
    kappaflow.toml, then defaults (see README, "Configuration").
    """
    ctx.obj = Context.from_options(
        config_file, state_dir, bootstrap_servers, spark_master, redis_url
    )


for _command in (
    *services.COMMANDS,
    demo.demo,
    topics.topics,
    *data.COMMANDS,
    jobs.jobs,
    *count.COMMANDS,
    *iot.COMMANDS,
    sql.sql,
    *access.COMMANDS,
    spark.spark,
    mirror,
):
    cli.add_command(_command)
