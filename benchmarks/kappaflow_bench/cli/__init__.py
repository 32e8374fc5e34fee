"""The ``kappaflow-bench`` command line: long runs that print figures and write result
files, never part of the tests' time budget."""

from __future__ import annotations

from pathlib import Path

import click

from kappaflow import __version__
from kappaflow.cli import run_cli
from kappaflow.cli.context import Context, settings_options
from kappaflow_bench.cli import api, count, iot, nexmark, profile, push, scale_out, ysb


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kappaflow-bench")
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
    """kappaflow's benchmarks: the counting job, the job API against it, and the Yahoo
    Streaming Benchmark and Nexmark on kappaflow and its peers (Flink, Quix Streams).

    The settings are kappaflow's own, from the same flags, KAPPAFLOW_* environment
    variables and kappaflow.toml.
    """
    ctx.obj = Context.from_options(
        config_file, state_dir, bootstrap_servers, spark_master, redis_url
    )


for _command in (
    *count.COMMANDS,
    *api.COMMANDS,
    *iot.COMMANDS,
    *push.COMMANDS,
    *scale_out.COMMANDS,
    *ysb.COMMANDS,
    *nexmark.COMMANDS,
    *profile.COMMANDS,
):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """Run ``kappaflow-bench``; misuse is one line on stderr and a non-zero exit."""
    return run_cli(cli, "kappaflow-bench", argv)


__all__ = ["cli", "main"]
