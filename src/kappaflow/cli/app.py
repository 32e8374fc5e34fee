"""The root command: global options and lazily loaded settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kappaflow import __version__
from kappaflow.cli import count, data, jobs, services, topics, ysb
from kappaflow.cli.context import Context


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kappaflow")
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    help="TOML settings file [default: ./kappaflow.toml if present]",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    help="where services, checkpoints and logs live [default: .kappaflow]",
)
@click.option(
    "--bootstrap-servers",
    metavar="HOST:PORT[,…]",
    help="an external Kafka cluster (nothing embedded is started then)",
)
@click.option("--spark-master", metavar="URL", help="local[*], spark://host:7077, yarn, k8s://…")
@click.option("--redis-url", metavar="URL", help="an external Redis, redis://host:port/db")
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
    overrides: dict[str, Any] = {}
    if state_dir is not None:
        overrides["state_dir"] = state_dir
    if bootstrap_servers is not None:
        overrides["kafka"] = {"bootstrap_servers": bootstrap_servers}
    if spark_master is not None:
        overrides["spark"] = {"master": spark_master}
    if redis_url is not None:
        overrides["redis"] = {"url": redis_url}
    ctx.obj = Context(config_file, overrides)


for _command in (*services.COMMANDS, topics.topics, *data.COMMANDS, jobs.jobs, *count.COMMANDS):
    cli.add_command(_command)
for _command in ysb.COMMANDS:
    services.bench.add_command(_command)
