"""``kappaflow api serve``: the kappaflow service in the foreground. ``api start``, ``stop``
and ``status`` are the group's service commands (cli/services.py)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say
from kappaflow.cli.services import api


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
