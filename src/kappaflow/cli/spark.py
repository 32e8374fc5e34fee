"""``kappaflow spark start | stop | status``: a Spark standalone cluster on this machine."""

from __future__ import annotations

import os

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table


@click.group()
def spark() -> None:
    """A Spark standalone master and workers on this machine, for jobs to run on."""


@spark.command("start")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64))
@click.option(
    "--cores",
    type=click.IntRange(1, 1024),
    help="cores each worker offers [default: this machine's]",
)
@click.option("--memory", default="2g", show_default=True, help="memory each worker offers")
@pass_context
def spark_start(ctx: Context, workers: int, cores: int | None, memory: str) -> None:
    """Start the master and WORKERS workers where they do not run, and wait until the
    master counts them; then run jobs there with --spark-master (printed)."""
    from kappaflow.spark.standalone import StandaloneCluster

    cluster = StandaloneCluster(ctx.settings)
    for line in cluster.start(workers, cores=cores or os.cpu_count() or 1, memory=memory):
        say(line)
    say(f"run jobs there with: --spark-master {cluster.master_url}")


@spark.command("stop")
@pass_context
def spark_stop(ctx: Context) -> None:
    """Stop the workers, then the master (jobs running there lose their executors)."""
    from kappaflow.spark.standalone import StandaloneCluster

    for line in StandaloneCluster(ctx.settings).stop():
        say(line)


@spark.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def spark_status(ctx: Context, as_json: bool) -> None:
    """The master's address, its alive workers and cores, the applications, the daemons."""
    from kappaflow.spark.standalone import StandaloneCluster

    status = StandaloneCluster(ctx.settings).status()
    if as_json:
        json_line(status.as_dict())
        return
    say(
        f"master {status.master_url} (ui {status.ui_url}): "
        f"{status.alive_workers if status.alive_workers is not None else '?'} workers alive, "
        f"{status.cores if status.cores is not None else '?'} cores, "
        f"apps: {', '.join(status.apps) or 'none'}"
    )
    table(None, ["daemon", "state", "pid"], [[d.name, d.state, d.pid] for d in status.daemons])
