"""``push``: the service's push fan-out to many subscribers, beside a Kafka consumer."""

from __future__ import annotations

from pathlib import Path

import click

from kappaflow import services as svc
from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say, table
from kappaflow_bench.cli.options import rates


@click.command("push")
@click.option(
    "--subscribers",
    default=1000,
    show_default=True,
    type=click.IntRange(min=1, max=10_000),
    help="Server-Sent Events subscribers, each its own connection",
)
@click.option(
    "--rates",
    default="50,200,500",
    show_default=True,
    callback=rates("changes"),
    help="changes per second the job's changelog gets, comma-separated, one step each",
)
@click.option(
    "--duration",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="seconds measured per rate",
)
@click.option(
    "--warmup", default=5.0, show_default=True, type=click.FloatRange(min=0.0), help="seconds"
)
@click.option(
    "--batch-interval",
    default=0.5,
    show_default=True,
    type=click.FloatRange(min=0.01),
    help="seconds between the job's batches (one transaction each)",
)
@click.option(
    "--keys", default=1000, show_default=True, type=click.IntRange(min=1), help="distinct keys"
)
@click.option(
    "--out",
    "out_dir",
    default="bench-results/push",
    show_default=True,
    type=click.Path(path_type=Path),
)
@pass_context
def push(
    ctx: Context,
    subscribers: int,
    rates: list[float],
    duration: float,
    warmup: float,
    batch_interval: float,
    keys: int,
    out_dir: Path,
) -> None:
    """Changes per second the kappaflow service pushes to SUBSCRIBERS Server-Sent Events
    subscribers of one output, and the time from each change's Kafka commit to its
    arrival at them, beside a plain read_committed consumer of the same topic, at each
    rate. The service runs as a process of its own, on the embedded broker."""
    from kappaflow_bench.push import COLUMNS, rows, run

    settings = ctx.settings
    with svc.embedded_services(settings, say):
        result = run(
            settings,
            subscribers=subscribers,
            rates=rates,
            duration_s=duration,
            warmup_s=warmup,
            batch_interval_s=batch_interval,
            keys=keys,
            out_dir=out_dir,
            say=say,
        )
    table(f"Push to {subscribers} subscribers, {duration:g} s per rate", COLUMNS, rows(result))
    say(f"wrote {out_dir / 'result.json'}")


COMMANDS = (push,)
