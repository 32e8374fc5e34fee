"""The root command: global options, lazily loaded settings and commands.

A command's module is imported when the command runs (or when help lists it), not at
every start: `kappaflow count status` does not load the IoT application, the service or
the savepoint code. COMMANDS says where each top-level command lives; a test checks it
against the modules themselves.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click

from kappaflow import __version__
from kappaflow.cli.context import Context, settings_options

#: Each top-level command: its module and the command's name there.
COMMANDS: dict[str, tuple[str, str]] = {
    "setup": ("kappaflow.cli.services", "setup"),
    "up": ("kappaflow.cli.services", "up"),
    "down": ("kappaflow.cli.services", "down"),
    "status": ("kappaflow.cli.services", "status"),
    "kafka": ("kappaflow.cli.services", "kafka"),
    "redis": ("kappaflow.cli.services", "redis"),
    "mqtt": ("kappaflow.cli.services", "mqtt"),
    "postgres": ("kappaflow.cli.services", "postgres"),
    # The service's group is declared with the services; `api serve` comes with it.
    "api": ("kappaflow.cli.api", "api"),
    "demo": ("kappaflow.cli.demo", "demo"),
    "topics": ("kappaflow.cli.topics", "topics"),
    "produce": ("kappaflow.cli.data", "produce"),
    "consume": ("kappaflow.cli.data", "consume"),
    "replay": ("kappaflow.cli.data", "replay"),
    "jobs": ("kappaflow.cli.jobs", "jobs"),
    "count": ("kappaflow.cli.count", "count"),
    "counts": ("kappaflow.cli.count", "counts"),
    "iot": ("kappaflow.cli.iot", "iot"),
    "sql": ("kappaflow.cli.sql", "sql"),
    "lake": ("kappaflow.cli.lake", "lake"),
    "users": ("kappaflow.cli.access", "users"),
    "acls": ("kappaflow.cli.access", "acls"),
    "spark": ("kappaflow.cli.spark", "spark"),
    "mirror": ("kappaflow.cli.mirror", "mirror"),
    "connect": ("kappaflow.cli.connect", "connect"),
    "dlq": ("kappaflow.cli.dlq", "dlq"),
    "registry": ("kappaflow.cli.registry", "registry"),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use, from COMMANDS."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, name = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), name)
            assert isinstance(command, click.Command), f"{module}.{name} is not a command"
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
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
    kappaflow.toml, then defaults (docs/configuration.md).
    """
    ctx.obj = Context.from_options(
        config_file, state_dir, bootstrap_servers, spark_master, redis_url
    )
