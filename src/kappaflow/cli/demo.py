"""``demo``: page views counted live, the quickest look at what kappaflow does."""

from __future__ import annotations

import click

from kappaflow.cli.context import Context, pass_context


@click.command()
@click.option("--seconds", default=60.0, show_default=True, help="how long to run")
@click.option("--rate", default=500, show_default=True, help="page views per second")
@pass_context
def demo(ctx: Context, seconds: float, rate: int) -> None:
    """Page views counted per page per minute, shown live (Ctrl-C ends it)."""
    from rich.console import Console

    from kappaflow.demos.clicks import run_demo

    run_demo(
        ctx.settings,
        seconds=seconds,
        rate=rate,
        console=Console(),
        overrides=ctx.overrides,
        config_file=ctx.config_file,
    )
