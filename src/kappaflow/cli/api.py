"""``kappaflow api serve``: the kappaflow service in the foreground. ``api start``, ``stop``
and ``status`` are the group's service commands (cli/services.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say, table
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
    check_bind(settings)
    say(f"kappaflow service on {settings.api.url} (Ctrl-C stops it)")
    config = uvicorn.Config(
        create_app(settings),
        host=settings.api.host,
        port=settings.api.port,
        log_level="warning",
    )
    uvicorn.Server(config).run()


@api.group("token")
def token() -> None:
    """API tokens: once one exists, every request needs one (docs/api.md)."""


@token.command("create")
@click.argument("name")
@click.option(
    "--scope",
    type=click.Choice(["read", "admin"]),
    default="read",
    show_default=True,
    help="read: every answer of the service; admin: also manage the tokens",
)
@pass_context
def token_create(ctx: Context, name: str, scope: str) -> None:
    """Create the token NAME and print it: it is shown this once, and kept only hashed."""
    from kappaflow.api.auth import Role, TokenStore, tokens_path

    created = TokenStore(tokens_path(ctx.settings)).create(name, Role(scope))
    say(f"token {name} ({scope}) created; it is not shown again:")
    click.echo(created)


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per token")
@pass_context
def token_list(ctx: Context, as_json: bool) -> None:
    """The tokens: names, scopes and when they were made (never the tokens)."""
    from kappaflow.api.auth import TokenStore, tokens_path

    found = [t.public() for t in TokenStore(tokens_path(ctx.settings)).tokens().values()]
    if as_json:
        for item in found:
            click.echo(json.dumps(item))
        return
    table("API tokens", ["name", "scope", "created"], [list(t.values()) for t in found])


@token.command("revoke")
@click.argument("name")
@pass_context
def token_revoke(ctx: Context, name: str) -> None:
    """Revoke the token NAME: requests with it are refused from now on."""
    from kappaflow.api.auth import TokenStore, tokens_path

    TokenStore(tokens_path(ctx.settings)).revoke(name)
    say(f"token {name} revoked")
