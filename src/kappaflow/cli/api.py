"""``kappaflow api``: the kappaflow service (the HTTP API over jobs and their results)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import iso_from_epoch_s, json_line, say, table


@click.group(name="api")
def api() -> None:
    """The kappaflow service: jobs, their status and results over HTTP (docs/api.md)."""


@api.command("start")
@pass_context
def start(ctx: Context) -> None:
    """Start the service in the background and wait until it answers."""
    from kappaflow.api.server import EmbeddedApi

    service = EmbeddedApi(ctx.settings)
    started = service.start()
    say(f"api {'started' if started else 'already running'} on {service.url}")


@api.command("stop")
@pass_context
def stop(ctx: Context) -> None:
    """Stop the service."""
    from kappaflow.api.server import EmbeddedApi

    stopped = EmbeddedApi(ctx.settings).stop()
    say("api stopped" if stopped else "api was not running")


@api.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def status(ctx: Context, as_json: bool) -> None:
    """Whether the service runs, its pid and address."""
    from kappaflow.api.server import EmbeddedApi

    found = EmbeddedApi(ctx.settings).status()
    row = {
        "state": found.state.value,
        "pid": found.pid,
        "url": found.url,
        "started_at": iso_from_epoch_s(found.started_at),
    }
    if as_json:
        json_line(row)
    else:
        table(None, list(row), [list(row.values())])


@api.command("serve")
@click.option(
    "--home",
    type=click.Path(path_type=Path),
    help="the directory that marks this service as its state directory's (api start sets it)",
)
@pass_context
def serve(ctx: Context, home: Path | None) -> None:
    """Run the service in the foreground until Ctrl-C (api start runs this detached)."""
    import uvicorn

    from kappaflow.api.app import create_app
    from kappaflow.api.server import SETTINGS_ENV, check_bind
    from kappaflow.settings import Settings

    given = os.environ.get(SETTINGS_ENV)
    settings = Settings.model_validate_json(given) if given else ctx.settings
    check_bind(settings.api.host)
    say(f"kappaflow service on {settings.api.url} (Ctrl-C stops it)")
    config = uvicorn.Config(
        create_app(settings),
        host=settings.api.host,
        port=settings.api.port,
        log_level="warning",
    )
    uvicorn.Server(config).run()


COMMANDS = (api,)
